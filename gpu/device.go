package gpu

import (
	"errors"
	"fmt"
)

// ErrUnavailable reports a device kind that this build or machine cannot provide.
var ErrUnavailable = errors.New("gpu: device unavailable")

// ErrBadSpec reports a device spec that cannot be parsed.
var ErrBadSpec = errors.New("gpu: bad device spec")

// Buffer is an opaque handle to float32 storage on a Device.
type Buffer interface {
	// Len returns the number of float32 elements the buffer holds.
	Len() int
}

// ConvShape describes a 2-D convolution's geometry over an NHWC input of
// N×H×W×C with a KH×KW kernel, the given stride and zero padding. OutH and OutW
// are derived by Out.
type ConvShape struct {
	N, H, W, C  int
	KH, KW      int
	Stride, Pad int
	OutH, OutW  int
}

// NewConvShape returns the ConvShape with OutH and OutW filled in; it reports an
// error when the geometry is invalid.
func NewConvShape(n, h, w, c, kh, kw, stride, pad int) (ConvShape, error) {
	s := ConvShape{N: n, H: h, W: w, C: c, KH: kh, KW: kw, Stride: stride, Pad: pad}
	if n < 0 || h <= 0 || w <= 0 || c <= 0 || kh <= 0 || kw <= 0 || stride <= 0 || pad < 0 {
		return s, fmt.Errorf("gpu: invalid conv geometry %+v", s)
	}
	s.OutH = (h+2*pad-kh)/stride + 1
	s.OutW = (w+2*pad-kw)/stride + 1
	if h+2*pad < kh || w+2*pad < kw || s.OutH <= 0 || s.OutW <= 0 {
		return s, fmt.Errorf("gpu: kernel %dx%d larger than padded input %dx%d", kh, kw, h+2*pad, w+2*pad)
	}
	return s, nil
}

// ColRows is the number of rows of the im2col matrix: N·OutH·OutW.
func (s ConvShape) ColRows() int { return s.N * s.OutH * s.OutW }

// ColCols is the number of columns of the im2col matrix: KH·KW·C.
func (s ConvShape) ColCols() int { return s.KH * s.KW * s.C }

// InLen is the number of elements of the NHWC input.
func (s ConvShape) InLen() int { return s.N * s.H * s.W * s.C }

// PoolShape describes a max pooling over an NHWC input of N×H×W×C with a K×K
// window moved by Stride, without padding (partial windows are dropped).
type PoolShape struct {
	N, H, W, C int
	K, Stride  int
	OutH, OutW int
}

// NewPoolShape returns the PoolShape with OutH and OutW filled in; it reports an
// error when the geometry is invalid.
func NewPoolShape(n, h, w, c, k, stride int) (PoolShape, error) {
	s := PoolShape{N: n, H: h, W: w, C: c, K: k, Stride: stride}
	if n < 0 || h <= 0 || w <= 0 || c <= 0 || k <= 0 || stride <= 0 || k > h || k > w {
		return s, fmt.Errorf("gpu: invalid pool geometry %+v", s)
	}
	s.OutH = (h-k)/stride + 1
	s.OutW = (w-k)/stride + 1
	return s, nil
}

// InLen is the number of elements of the NHWC input.
func (s PoolShape) InLen() int { return s.N * s.H * s.W * s.C }

// OutLen is the number of elements of the NHWC output.
func (s PoolShape) OutLen() int { return s.N * s.OutH * s.OutW * s.C }

// Device is a compute device: memory, GEMM and the kernels of the model layers.
// Each kernel's doc comment gives its reference loop; the conformance suite in
// gpu/devicetest checks every implementation against those loops.
type Device interface {
	// Name returns the device's spec-style name, e.g. "cpu:0" or "cuda:1".
	Name() string

	// Alloc returns a new zero-filled buffer of n float32 elements.
	Alloc(n int) (Buffer, error)
	// Free releases b. Views of b and b itself must not be used afterwards.
	// Freeing a view is a no-op.
	Free(b Buffer)
	// View returns the n elements of b starting at off, sharing b's storage.
	View(b Buffer, off, n int) Buffer
	// CopyToDevice copies len(src) elements into the start of dst.
	CopyToDevice(dst Buffer, src []float32)
	// CopyToHost copies len(dst) elements from the start of src, after all
	// earlier work on the device has finished.
	CopyToHost(dst []float32, src Buffer)
	// Copy copies src into dst (same length).
	Copy(dst, src Buffer)
	// Fill sets every element of dst to v.
	Fill(dst Buffer, v float32)
	// Synchronize waits for all issued work and returns any deferred error.
	Synchronize() error

	// Gemm computes C = alpha·op(A)·op(B) + beta·C, row-major, where op(A) is
	// m×k and op(B) is k×n (see package gpu/sgemm for the reference loop).
	// With beta == 0, C's prior contents are ignored (NaNs included).
	Gemm(transA, transB bool, m, n, k int, alpha float32, a Buffer, lda int, b Buffer, ldb int, beta float32, c Buffer, ldc int)

	// Add sets dst[i] = a[i] + b[i]. dst may alias a or b.
	Add(dst, a, b Buffer)
	// Mul sets dst[i] = a[i] * b[i]. dst may alias a or b.
	Mul(dst, a, b Buffer)
	// Axpy sets y[i] = alpha*x[i] + y[i] (the product rounded to float32 first).
	Axpy(alpha float32, x, y Buffer)
	// Scale sets x[i] = alpha * x[i].
	Scale(alpha float32, x Buffer)

	// ReLU sets y[i] = max(x[i], 0). y may alias x.
	ReLU(y, x Buffer)
	// ReLUBackward sets dx[i] = dy[i] if x[i] > 0, else 0. dx may alias dy.
	ReLUBackward(dx, x, dy Buffer)
	// GELU sets y[i] = x[i]·Φ(x[i]) with the exact (erf) form. y may alias x.
	GELU(y, x Buffer)
	// GELUBackward sets dx[i] = dy[i]·(Φ(x[i]) + x[i]·φ(x[i])). dx may alias dy.
	GELUBackward(dx, x, dy Buffer)

	// AddBias adds bias[j] to x[i*cols+j] for every row i < rows.
	AddBias(x Buffer, rows, cols int, bias Buffer)
	// SumRows sets dst[j] = Σ_{i<rows} x[i*cols+j], summing rows in order.
	SumRows(dst, x Buffer, rows, cols int)

	// SoftmaxCrossEntropy computes, for each of rows rows of logits (cols
	// classes), probs = softmax(row) and loss[i] = -log(probs[i][labels[i]]).
	// labels holds class indices in [0, cols) as float32.
	SoftmaxCrossEntropy(probs, loss, logits, labels Buffer, rows, cols int)
	// SoftmaxCrossEntropyBackward sets dlogits[i][j] = scale·(probs[i][j] − [j == labels[i]]).
	SoftmaxCrossEntropyBackward(dlogits, probs, labels Buffer, rows, cols int, scale float32)

	// Im2Col fills col (ColRows×ColCols) from the NHWC input x:
	// col[(n·OutH+oh)·OutW+ow][(kh·KW+kw)·C+c] = x[n][oh·S−P+kh][ow·S−P+kw][c], or 0
	// where that position lies in the padding.
	Im2Col(col, x Buffer, s ConvShape)
	// Col2Im is Im2Col's adjoint: dx is zeroed, then every element of col is
	// added to the input position it was taken from, in col's row-major order.
	Col2Im(dx, col Buffer, s ConvShape)

	// MaxPool sets y[n][oh][ow][c] to the maximum of x over its window and
	// argmax to the in-plane index ih·W+iw of the first maximum in window scan
	// order (kh, then kw).
	MaxPool(y, argmax, x Buffer, s PoolShape)
	// MaxPoolBackward zeroes dx, then adds dy[n][oh][ow][c] at the position
	// argmax selected, in y's row-major order.
	MaxPoolBackward(dx, dy, argmax Buffer, s PoolShape)

	// LayerNorm normalises each of rows rows of x (cols wide):
	// mean[i], rstd[i] = 1/sqrt(var[i]+eps) (biased variance), and
	// y[i][j] = (x[i][j]−mean[i])·rstd[i]·gamma[j] + beta[j].
	LayerNorm(y, mean, rstd, x, gamma, beta Buffer, rows, cols int, eps float32)
	// LayerNormBackward computes dx, dgamma and dbeta from dy, with x̂ = (x−mean)·rstd:
	// dgamma[j] = Σ_i dy·x̂, dbeta[j] = Σ_i dy,
	// dx = rstd·(g − mean_j(g) − x̂·mean_j(g·x̂)) where g = dy·gamma.
	LayerNormBackward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma Buffer, rows, cols int)

	// Embedding gathers rows of a vocab×dim table: y[i][j] = table[ids[i]][j]
	// for i < rows, where ids holds token indices in [0, vocab) as float32.
	Embedding(y, table, ids Buffer, rows, vocab, dim int)
	// EmbeddingBackward adds the rows of dy into the table gradient:
	// for i = 0, 1, … rows−1 in order, dtable[ids[i]][j] += dy[i][j]. dtable
	// is not cleared first (a tied output head may have written it).
	EmbeddingBackward(dtable, ids, dy Buffer, rows, vocab, dim int)
	// CausalSoftmax applies a scaled, causally masked softmax to each row i of
	// blocks t×t blocks of x: with s[k] = scale·x[i][k] and m = max_{k≤i} s[k],
	// y[i][j] = exp(s[j]−m) / Σ_{k≤i} exp(s[k]−m) for j ≤ i, and 0 for j > i
	// (in float64, rounded once). y may alias x.
	CausalSoftmax(y, x Buffer, blocks, t int, scale float32)
	// CausalSoftmaxBackward is CausalSoftmax's gradient from its output y:
	// dx[i][j] = scale·y[i][j]·(dy[i][j] − Σ_{k≤i} y[i][k]·dy[i][k]) for
	// j ≤ i, and 0 for j > i (in float64, rounded once). dx may alias dy.
	CausalSoftmaxBackward(dx, y, dy Buffer, blocks, t int, scale float32)

	// DropoutMask sets mask[i] = 1/(1−p) if Uniform(seed, i) ≥ p, else 0.
	DropoutMask(mask Buffer, p float32, seed uint64)

	// Close releases what the device holds (for CUDA: the kernels, the
	// cuBLAS handle and the context). Every buffer must have been freed
	// first; the device must not be used afterwards.
	Close() error
}

// CloseAll closes every device in devs and returns their errors joined.
func CloseAll(devs []Device) error {
	var errs []error
	for _, d := range devs {
		if err := d.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", d.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// Uniform is the counter-based random number every device uses for dropout:
// a float32 in [0, 1) from the 24 high bits of splitmix64(seed + (i+1)·φ).
// Being a pure function of (seed, i), it gives every device the same masks.
func Uniform(seed, i uint64) float32 {
	z := seed + (i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float32(z>>40) * (1.0 / (1 << 24))
}
