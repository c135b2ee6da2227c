package cudadev

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/gpu/cuda"
)

// KernelSource is the CUDA C of every kernel but GEMM (kernels.cu).
//
//go:embed kernels.cu
var KernelSource string

// CompileOptions are the NVRTC options besides the architecture.
// -fmad=false keeps every multiply and add separately rounded, as the CPU
// device rounds them (Axpy's reference rounds the product first).
var CompileOptions = []string{"-fmad=false"}

// kernel identifies one kernel of KernelSource.
type kernel int

const (
	kAdd kernel = iota
	kMul
	kAxpy
	kScale
	kScale2D
	kReLU
	kReLUBackward
	kGELU
	kGELUBackward
	kAddBias
	kSumRows
	kSoftmaxXent
	kSoftmaxXentBackward
	kIm2Col
	kCol2Im
	kMaxPool
	kMaxPoolBackward
	kLayerNorm
	kLayerNormBackwardParams
	kLayerNormBackwardDx
	kDropoutMask
	kEmbedding
	kEmbeddingBackward
	kCausalSoftmax
	kCausalSoftmaxBackward
	numKernels
)

// KernelNames lists the kernels' names in KernelSource, indexed by kernel.
var KernelNames = [numKernels]string{
	"k_add", "k_mul", "k_axpy", "k_scale", "k_scale2d", "k_relu", "k_relu_backward", "k_gelu",
	"k_gelu_backward", "k_add_bias", "k_sum_rows", "k_softmax_xent", "k_softmax_xent_backward",
	"k_im2col", "k_col2im", "k_maxpool", "k_maxpool_backward", "k_layernorm",
	"k_layernorm_backward_params", "k_layernorm_backward_dx", "k_dropout_mask",
	"k_embedding", "k_embedding_backward", "k_causal_softmax", "k_causal_softmax_backward",
}

// Launch geometry: blockThreads threads a block, at most maxBlocks blocks;
// the kernels' grid-stride loops cover larger sizes.
const (
	blockThreads = 256
	maxBlocks    = 1 << 16
)

// errLabel is the error-word value the softmax kernels leave for a label
// that is not a class index (ERR_LABEL in kernels.cu).
const errLabel = 1

// errToken is the error-word value the embedding kernels leave for a token
// that is not an index into the table (ERR_TOKEN in kernels.cu).
const errToken = 2

// Device is one CUDA GPU as a gpu.Device: buffers in device memory, GEMM
// through cuBLAS (fp32 math, no TF32) and the other kernels compiled from
// KernelSource by NVRTC, all queued in order on one stream.
//
// The methods of gpu.Device return no errors, so a driver error met by an
// asynchronous operation is recorded and returned by Synchronize (the first
// one; later work is skipped, and the device stays failed). While an error
// is recorded, CopyToHost fills its destination with NaN, so a caller that
// never calls Synchronize still sees non-finite results rather than stale
// ones. Misuse (a short buffer, a foreign buffer) panics with a "gpu:"
// message, as on the CPU device.
type Device struct {
	name string
	info cuda.DeviceInfo
	ctx  *cuda.Context
	blas *cuda.BLASHandle
	mod  cuda.Module
	fns  [numKernels]cuda.Function
	// errWord is a device int the kernels set to report bad input.
	errWord cuda.DevicePtr

	mu  sync.Mutex
	err error
	// args and params hold a launch's argument values and pointers to them;
	// they live in the Device (the heap) so the pointers stay valid.
	args   [16]uint64
	params [16]unsafe.Pointer
}

var _ gpu.Device = (*Device)(nil)

// buffer is a Device's gpu.Buffer: n float32 at ptr.
type buffer struct {
	ptr  cuda.DevicePtr
	n    int
	dev  *Device
	view bool
}

func (b *buffer) Len() int { return b.n }

// Name returns "cuda:N".
func (d *Device) Name() string { return d.name }

// Info describes the GPU.
func (d *Device) Info() cuda.DeviceInfo { return d.info }

// fail records err as the device's deferred error, if it is the first.
func (d *Device) fail(err error) {
	d.mu.Lock()
	if d.err == nil {
		d.err = fmt.Errorf("gpu: %s: %w", d.name, err)
	}
	d.mu.Unlock()
}

func (d *Device) failed() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// do runs fn with the device's context current on a locked OS thread,
// recording its error. It skips fn once the device has failed.
func (d *Device) do(fn func() error) {
	if d.failed() != nil {
		return
	}
	err := d.ctx.Enter()
	if err == nil {
		err = fn()
	}
	d.ctx.Leave()
	if err != nil {
		d.fail(err)
	}
}

func (d *Device) buf(b gpu.Buffer) *buffer {
	cb, ok := b.(*buffer)
	if !ok || cb == nil {
		panic(fmt.Sprintf("gpu: %s: buffer of type %T is not a CUDA buffer", d.name, b))
	}
	if cb.dev != d {
		panic(fmt.Sprintf("gpu: %s: buffer belongs to %s", d.name, cb.dev.name))
	}
	return cb
}

// at returns b, checking it holds at least n elements.
func (d *Device) at(b gpu.Buffer, n int, what string) *buffer {
	cb := d.buf(b)
	if cb.n < n {
		panic(fmt.Sprintf("gpu: %s: %s has %d elements, need %d", d.name, what, cb.n, n))
	}
	return cb
}

// same returns the buffers, checking they have equal lengths.
func (d *Device) same(what string, bs ...gpu.Buffer) []*buffer {
	out := make([]*buffer, len(bs))
	for i, b := range bs {
		out[i] = d.buf(b)
		if out[i].n != out[0].n {
			panic(fmt.Sprintf("gpu: %s: %s: lengths %d and %d differ", d.name, what, out[0].n, out[i].n))
		}
	}
	return out
}

// dims panics unless every dimension is non-negative.
func (d *Device) dims(what string, ds ...int) {
	for _, v := range ds {
		if v < 0 {
			panic(fmt.Sprintf("gpu: %s: %s: negative dimension in %v", d.name, what, ds))
		}
	}
}

// launch queues kernel k over n work items with the given arguments:
// buffers (*buffer), int, float32, uint64 and cuda.DevicePtr.
func (d *Device) launch(k kernel, n int, args ...any) {
	if n <= 0 {
		return
	}
	if len(args) > len(d.args) {
		panic("gpu: cudadev: too many kernel arguments")
	}
	d.do(func() error {
		for i, a := range args {
			var v uint64
			switch a := a.(type) {
			case *buffer:
				v = uint64(a.ptr)
			case cuda.DevicePtr:
				v = uint64(a)
			case int:
				v = uint64(int64(a))
			case float32:
				v = uint64(math.Float32bits(a))
			case uint64:
				v = a
			default:
				panic(fmt.Sprintf("gpu: cudadev: kernel argument of type %T", a))
			}
			d.args[i] = v
			d.params[i] = unsafe.Pointer(&d.args[i])
		}
		blocks := min((n+blockThreads-1)/blockThreads, maxBlocks)
		return d.ctx.Launch(d.fns[k], uint32(blocks), blockThreads, d.params[:len(args)])
	})
}

// Alloc returns a zero-filled buffer of n elements.
func (d *Device) Alloc(n int) (gpu.Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("gpu: %s: alloc of %d elements", d.name, n)
	}
	if err := d.failed(); err != nil {
		return nil, err
	}
	b := &buffer{n: n, dev: d}
	if n == 0 {
		return b, nil
	}
	err := d.ctx.Enter()
	if err == nil {
		b.ptr, err = d.ctx.Alloc(4 * uint64(n))
		if err == nil {
			if err = d.ctx.Fill32(b.ptr, 0, uint64(n)); err != nil {
				d.ctx.Free(b.ptr)
			}
		}
	}
	d.ctx.Leave()
	if err != nil {
		return nil, fmt.Errorf("gpu: %s: alloc of %d elements: %w", d.name, n, err)
	}
	return b, nil
}

// Free releases b's device memory; freeing a view (or a freed buffer) does
// nothing.
func (d *Device) Free(b gpu.Buffer) {
	cb := d.buf(b)
	if cb.view || cb.n == 0 {
		return
	}
	p := cb.ptr
	cb.ptr, cb.n = 0, 0
	err := d.ctx.Enter()
	if err == nil {
		err = d.ctx.Free(p)
	}
	d.ctx.Leave()
	if err != nil {
		d.fail(err)
	}
}

// View returns n elements of b from off.
func (d *Device) View(b gpu.Buffer, off, n int) gpu.Buffer {
	cb := d.buf(b)
	if off < 0 || n < 0 || off+n > cb.n {
		panic(fmt.Sprintf("gpu: %s: view [%d:%d] of a %d-element buffer", d.name, off, off+n, cb.n))
	}
	return &buffer{ptr: cb.ptr + cuda.DevicePtr(4*off), n: n, dev: d, view: true}
}

// CopyToDevice copies src into the start of dst; it returns once src has
// been read.
func (d *Device) CopyToDevice(dst gpu.Buffer, src []float32) {
	b := d.at(dst, len(src), "CopyToDevice dst")
	if len(src) == 0 {
		return
	}
	d.do(func() error { return d.ctx.CopyToDevice(b.ptr, unsafe.Pointer(&src[0]), 4*uint64(len(src))) })
}

// CopyToHost copies the start of src into dst after all earlier work. When
// the device has failed, dst is filled with NaN instead.
func (d *Device) CopyToHost(dst []float32, src gpu.Buffer) {
	b := d.at(src, len(dst), "CopyToHost src")
	if len(dst) == 0 {
		return
	}
	d.do(func() error { return d.ctx.CopyToHost(unsafe.Pointer(&dst[0]), b.ptr, 4*uint64(len(dst))) })
	if d.failed() != nil {
		nan := float32(math.NaN())
		for i := range dst {
			dst[i] = nan
		}
	}
}

// Copy copies src into dst.
func (d *Device) Copy(dst, src gpu.Buffer) {
	bs := d.same("Copy", dst, src)
	if bs[0].n == 0 {
		return
	}
	d.do(func() error { return d.ctx.Copy(bs[0].ptr, bs[1].ptr, 4*uint64(bs[0].n)) })
}

// Fill sets every element of dst to v.
func (d *Device) Fill(dst gpu.Buffer, v float32) {
	b := d.buf(dst)
	if b.n == 0 {
		return
	}
	d.do(func() error { return d.ctx.Fill32(b.ptr, math.Float32bits(v), uint64(b.n)) })
}

// Synchronize waits for all queued work and returns the first deferred
// error: a failed launch or copy, or bad input a kernel reported.
func (d *Device) Synchronize() error {
	d.do(func() error {
		var word int32
		if err := d.ctx.CopyToHost(unsafe.Pointer(&word), d.errWord, 4); err != nil {
			return err
		}
		if word == 0 {
			return nil
		}
		if err := d.ctx.Fill32(d.errWord, 0, 1); err != nil {
			return err
		}
		switch word {
		case errLabel:
			return errors.New("softmax cross-entropy: a label is not a class index")
		case errToken:
			return errors.New("embedding: a token is not an index into the table")
		}
		return fmt.Errorf("kernel reported error %d", word)
	})
	return d.failed()
}

// Gemm computes C = alpha·op(A)·op(B) + beta·C (row-major) with cuBLAS.
func (d *Device) Gemm(transA, transB bool, m, n, k int, alpha float32, a gpu.Buffer, lda int, b gpu.Buffer, ldb int, beta float32, c gpu.Buffer, ldc int) {
	d.dims("Gemm", m, n, k)
	ar, ac, br, bc := m, k, k, n
	if transA {
		ar, ac = k, m
	}
	if transB {
		br, bc = n, k
	}
	ab := d.matrix("Gemm a", a, ar, ac, lda)
	bb := d.matrix("Gemm b", b, br, bc, ldb)
	cb := d.matrix("Gemm c", c, m, n, ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		d.launch(kScale2D, m*n, cb, m, n, ldc, beta)
		return
	}
	g := cuda.RowMajorGemm(transA, transB, m, n, k, lda, ldb, ldc)
	d.do(func() error { return d.blas.Sgemm(g, alpha, bb.ptr, ab.ptr, beta, cb.ptr) })
}

// matrix checks that buffer x holds a rows×cols row-major matrix with row
// stride ld.
func (d *Device) matrix(what string, x gpu.Buffer, rows, cols, ld int) *buffer {
	cb := d.buf(x)
	if rows == 0 || cols == 0 {
		return cb
	}
	if ld < cols {
		panic(fmt.Sprintf("gpu: %s: %s stride %d < %d columns", d.name, what, ld, cols))
	}
	return d.at(x, (rows-1)*ld+cols, what)
}

// Add sets dst = a + b.
func (d *Device) Add(dst, a, b gpu.Buffer) {
	bs := d.same("Add", dst, a, b)
	d.launch(kAdd, bs[0].n, bs[0], bs[1], bs[2], bs[0].n)
}

// Mul sets dst = a ⊙ b.
func (d *Device) Mul(dst, a, b gpu.Buffer) {
	bs := d.same("Mul", dst, a, b)
	d.launch(kMul, bs[0].n, bs[0], bs[1], bs[2], bs[0].n)
}

// Axpy sets y += alpha·x.
func (d *Device) Axpy(alpha float32, x, y gpu.Buffer) {
	bs := d.same("Axpy", x, y)
	d.launch(kAxpy, bs[0].n, alpha, bs[0], bs[1], bs[0].n)
}

// Scale sets x *= alpha.
func (d *Device) Scale(alpha float32, x gpu.Buffer) {
	b := d.buf(x)
	d.launch(kScale, b.n, alpha, b, b.n)
}

// ReLU sets y = max(x, 0).
func (d *Device) ReLU(y, x gpu.Buffer) {
	bs := d.same("ReLU", y, x)
	d.launch(kReLU, bs[0].n, bs[0], bs[1], bs[0].n)
}

// ReLUBackward sets dx = dy where x > 0, else 0.
func (d *Device) ReLUBackward(dx, x, dy gpu.Buffer) {
	bs := d.same("ReLUBackward", dx, x, dy)
	d.launch(kReLUBackward, bs[0].n, bs[0], bs[1], bs[2], bs[0].n)
}

// GELU sets y = x·Φ(x).
func (d *Device) GELU(y, x gpu.Buffer) {
	bs := d.same("GELU", y, x)
	d.launch(kGELU, bs[0].n, bs[0], bs[1], bs[0].n)
}

// GELUBackward sets dx = dy·GELU'(x).
func (d *Device) GELUBackward(dx, x, dy gpu.Buffer) {
	bs := d.same("GELUBackward", dx, x, dy)
	d.launch(kGELUBackward, bs[0].n, bs[0], bs[1], bs[2], bs[0].n)
}

// AddBias adds bias to every row of x.
func (d *Device) AddBias(x gpu.Buffer, rows, cols int, bias gpu.Buffer) {
	d.dims("AddBias", rows, cols)
	xb := d.at(x, rows*cols, "AddBias x")
	bb := d.at(bias, cols, "AddBias bias")
	d.launch(kAddBias, rows*cols, xb, bb, rows, cols)
}

// SumRows sets dst[j] = Σ_i x[i][j], rows in order.
func (d *Device) SumRows(dst, x gpu.Buffer, rows, cols int) {
	d.dims("SumRows", rows, cols)
	xb := d.at(x, rows*cols, "SumRows x")
	db := d.at(dst, cols, "SumRows dst")
	d.launch(kSumRows, cols, db, xb, rows, cols)
}

// SoftmaxCrossEntropy computes softmax probabilities and per-row losses. A
// label that is not a class index gives a NaN loss and an error from
// Synchronize.
func (d *Device) SoftmaxCrossEntropy(probs, loss, logits, labels gpu.Buffer, rows, cols int) {
	if rows < 0 || cols <= 0 {
		panic(fmt.Sprintf("gpu: %s: SoftmaxCrossEntropy rows=%d cols=%d", d.name, rows, cols))
	}
	p := d.at(probs, rows*cols, "SoftmaxCrossEntropy probs")
	l := d.at(loss, rows, "SoftmaxCrossEntropy loss")
	z := d.at(logits, rows*cols, "SoftmaxCrossEntropy logits")
	y := d.at(labels, rows, "SoftmaxCrossEntropy labels")
	d.launch(kSoftmaxXent, rows, p, l, z, y, rows, cols, d.errWord)
}

// SoftmaxCrossEntropyBackward sets dlogits = scale·(probs − onehot(labels)).
func (d *Device) SoftmaxCrossEntropyBackward(dlogits, probs, labels gpu.Buffer, rows, cols int, scale float32) {
	if rows < 0 || cols <= 0 {
		panic(fmt.Sprintf("gpu: %s: SoftmaxCrossEntropyBackward rows=%d cols=%d", d.name, rows, cols))
	}
	g := d.at(dlogits, rows*cols, "SoftmaxCrossEntropyBackward dlogits")
	p := d.at(probs, rows*cols, "SoftmaxCrossEntropyBackward probs")
	y := d.at(labels, rows, "SoftmaxCrossEntropyBackward labels")
	d.launch(kSoftmaxXentBackward, rows*cols, g, p, y, rows, cols, scale, d.errWord)
}

// Im2Col gathers convolution patches of the NHWC input into col.
func (d *Device) Im2Col(col, x gpu.Buffer, s gpu.ConvShape) {
	c := d.at(col, s.ColRows()*s.ColCols(), "Im2Col col")
	in := d.at(x, s.InLen(), "Im2Col x")
	d.launch(kIm2Col, s.ColRows()*s.ColCols(), c, in, s.N, s.H, s.W, s.C, s.KH, s.KW, s.Stride, s.Pad, s.OutH, s.OutW)
}

// Col2Im scatters col back onto the NHWC input gradient dx.
func (d *Device) Col2Im(dx, col gpu.Buffer, s gpu.ConvShape) {
	c := d.at(col, s.ColRows()*s.ColCols(), "Col2Im col")
	out := d.at(dx, s.InLen(), "Col2Im dx")
	d.launch(kCol2Im, s.InLen(), out, c, s.N, s.H, s.W, s.C, s.KH, s.KW, s.Stride, s.Pad, s.OutH, s.OutW)
}

// MaxPool takes window maxima and records their in-plane positions.
func (d *Device) MaxPool(y, argmax, x gpu.Buffer, s gpu.PoolShape) {
	out := d.at(y, s.OutLen(), "MaxPool y")
	am := d.at(argmax, s.OutLen(), "MaxPool argmax")
	in := d.at(x, s.InLen(), "MaxPool x")
	d.launch(kMaxPool, s.OutLen(), out, am, in, s.N, s.H, s.W, s.C, s.K, s.Stride, s.OutH, s.OutW)
}

// MaxPoolBackward routes dy to the maxima MaxPool recorded in argmax (an
// argmax outside its window, which MaxPool never writes, is ignored).
func (d *Device) MaxPoolBackward(dx, dy, argmax gpu.Buffer, s gpu.PoolShape) {
	out := d.at(dx, s.InLen(), "MaxPoolBackward dx")
	g := d.at(dy, s.OutLen(), "MaxPoolBackward dy")
	am := d.at(argmax, s.OutLen(), "MaxPoolBackward argmax")
	d.launch(kMaxPoolBackward, s.InLen(), out, g, am, s.N, s.H, s.W, s.C, s.K, s.Stride, s.OutH, s.OutW)
}

// LayerNorm normalises rows of x.
func (d *Device) LayerNorm(y, mean, rstd, x, gamma, beta gpu.Buffer, rows, cols int, eps float32) {
	out, mu, rs, in, ga, be := gpu.LayerNormViews(d.name, d.at, y, mean, rstd, x, gamma, beta, rows, cols)
	d.launch(kLayerNorm, rows, out, mu, rs, in, ga, be, rows, cols, eps)
}

// LayerNormBackward computes the gradients of LayerNorm.
func (d *Device) LayerNormBackward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma gpu.Buffer, rows, cols int) {
	gx, gg, gb, g, in, mu, rs, ga := gpu.LayerNormBackwardViews(d.name, d.at, dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, cols)
	if rows == 0 {
		d.Fill(gg, 0)
		d.Fill(gb, 0)
		return
	}
	d.launch(kLayerNormBackwardParams, cols, gg, gb, g, in, mu, rs, rows, cols)
	d.launch(kLayerNormBackwardDx, rows, gx, g, in, mu, rs, ga, rows, cols)
}

// DropoutMask fills mask with 0 or 1/(1−p) from gpu.Uniform(seed, i).
func (d *Device) DropoutMask(mask gpu.Buffer, p float32, seed uint64) {
	if !(p >= 0 && p < 1) {
		panic(fmt.Sprintf("gpu: %s: dropout probability %v not in [0, 1)", d.name, p))
	}
	m := d.buf(mask)
	d.launch(kDropoutMask, m.n, m, m.n, p, seed)
}

// Embedding gathers table rows by token index. A token that is not an index
// gives a NaN row and an error from Synchronize.
func (d *Device) Embedding(y, table, ids gpu.Buffer, rows, vocab, dim int) {
	out, tab, id := gpu.EmbeddingViews(d.name, d.at, y, table, ids, rows, vocab, dim)
	d.launch(kEmbedding, rows*dim, out, tab, id, rows, vocab, dim, d.errWord)
}

// EmbeddingBackward adds the rows of dy into dtable, one thread per column
// taking the rows in order. A token that is not an index is skipped and
// gives an error from Synchronize.
func (d *Device) EmbeddingBackward(dtable, ids, dy gpu.Buffer, rows, vocab, dim int) {
	tab, id, g := gpu.EmbeddingBackwardViews(d.name, d.at, dtable, ids, dy, rows, vocab, dim)
	if rows == 0 {
		return
	}
	d.launch(kEmbeddingBackward, dim, tab, id, g, rows, vocab, dim, d.errWord)
}

// CausalSoftmax applies the scaled, causally masked row softmax to t×t blocks.
func (d *Device) CausalSoftmax(y, x gpu.Buffer, blocks, t int, scale float32) {
	out, in := gpu.CausalSoftmaxViews(d.name, d.at, y, x, blocks, t)
	d.launch(kCausalSoftmax, blocks*t, out, in, blocks, t, scale)
}

// CausalSoftmaxBackward computes CausalSoftmax's input gradient from its output.
func (d *Device) CausalSoftmaxBackward(dx, y, dy gpu.Buffer, blocks, t int, scale float32) {
	gx, out, g := gpu.CausalSoftmaxBackwardViews(d.name, d.at, dx, y, dy, blocks, t)
	d.launch(kCausalSoftmaxBackward, blocks*t, gx, out, g, blocks, t, scale)
}
