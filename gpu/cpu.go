package gpu

import (
	"fmt"
	"math"

	"github.com/p2ptrain/p2ptrain/gpu/sgemm"
)

// CPU is the host-memory Device. Its kernels run synchronously on the calling
// goroutine; its Buffers are []float32. Several CPU devices ("cpu:0", "cpu:1")
// share the host but act as separate local devices.
type CPU struct {
	index int
	name  string
}

var _ Device = (*CPU)(nil)

// NewCPU returns the CPU device with the given index.
func NewCPU(index int) *CPU {
	return &CPU{index: index, name: fmt.Sprintf("cpu:%d", index)}
}

// cpuBuffer is a CPU device's Buffer.
type cpuBuffer struct {
	data []float32
	dev  *CPU
	view bool
}

func (b *cpuBuffer) Len() int { return len(b.data) }

// Name returns "cpu:N".
func (d *CPU) Name() string { return d.name }

// Alloc returns a zero-filled buffer of n elements.
func (d *CPU) Alloc(n int) (Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("gpu: %s: alloc of %d elements", d.name, n)
	}
	return &cpuBuffer{data: make([]float32, n), dev: d}, nil
}

// Free drops the buffer's storage.
func (d *CPU) Free(b Buffer) {
	cb := d.buf(b)
	if !cb.view {
		cb.data = nil
	}
}

// View returns n elements of b from off.
func (d *CPU) View(b Buffer, off, n int) Buffer {
	cb := d.buf(b)
	if off < 0 || n < 0 || off+n > len(cb.data) {
		panic(fmt.Sprintf("gpu: %s: view [%d:%d] of a %d-element buffer", d.name, off, off+n, len(cb.data)))
	}
	return &cpuBuffer{data: cb.data[off : off+n : off+n], dev: d, view: true}
}

// Data returns the host slice behind a CPU buffer (no copy). It is for tests
// and CPU-only fast paths; device-independent code uses CopyToHost.
func (d *CPU) Data(b Buffer) []float32 { return d.buf(b).data }

func (d *CPU) buf(b Buffer) *cpuBuffer {
	cb, ok := b.(*cpuBuffer)
	if !ok || cb == nil {
		panic(fmt.Sprintf("gpu: %s: buffer of type %T is not a CPU buffer", d.name, b))
	}
	if cb.dev != d {
		panic(fmt.Sprintf("gpu: %s: buffer belongs to %s", d.name, cb.dev.name))
	}
	return cb
}

// at returns b's data, checking it holds at least n elements.
func (d *CPU) at(b Buffer, n int, what string) []float32 {
	s := d.buf(b).data
	if len(s) < n {
		panic(fmt.Sprintf("gpu: %s: %s has %d elements, need %d", d.name, what, len(s), n))
	}
	return s[:n]
}

func (d *CPU) same(a, b Buffer, what string) ([]float32, []float32) {
	x, y := d.buf(a).data, d.buf(b).data
	if len(x) != len(y) {
		panic(fmt.Sprintf("gpu: %s: %s: lengths %d and %d differ", d.name, what, len(x), len(y)))
	}
	return x, y
}

// CopyToDevice copies src into the start of dst.
func (d *CPU) CopyToDevice(dst Buffer, src []float32) {
	copy(d.at(dst, len(src), "CopyToDevice dst"), src)
}

// CopyToHost copies the start of src into dst.
func (d *CPU) CopyToHost(dst []float32, src Buffer) {
	copy(dst, d.at(src, len(dst), "CopyToHost src"))
}

// Copy copies src into dst.
func (d *CPU) Copy(dst, src Buffer) {
	x, y := d.same(dst, src, "Copy")
	copy(x, y)
}

// Fill sets every element of dst to v.
func (d *CPU) Fill(dst Buffer, v float32) {
	s := d.buf(dst).data
	if v == 0 {
		clear(s)
		return
	}
	for i := range s {
		s[i] = v
	}
}

// Synchronize returns nil: CPU kernels are synchronous.
func (d *CPU) Synchronize() error { return nil }

// Gemm runs sgemm.Sgemm on the buffers' storage.
func (d *CPU) Gemm(transA, transB bool, m, n, k int, alpha float32, a Buffer, lda int, b Buffer, ldb int, beta float32, c Buffer, ldc int) {
	sgemm.Sgemm(transA, transB, m, n, k, alpha, d.buf(a).data, lda, d.buf(b).data, ldb, beta, d.buf(c).data, ldc)
}

func (d *CPU) three(dst, a, b Buffer, what string) ([]float32, []float32, []float32) {
	x, y := d.same(dst, a, what)
	_, z := d.same(dst, b, what)
	return x, y, z
}

// Add sets dst = a + b.
func (d *CPU) Add(dst, a, b Buffer) {
	o, x, y := d.three(dst, a, b, "Add")
	for i := range o {
		o[i] = x[i] + y[i]
	}
}

// Mul sets dst = a ⊙ b.
func (d *CPU) Mul(dst, a, b Buffer) {
	o, x, y := d.three(dst, a, b, "Mul")
	for i := range o {
		o[i] = x[i] * y[i]
	}
}

// Axpy sets y += alpha·x.
func (d *CPU) Axpy(alpha float32, x, y Buffer) {
	xs, ys := d.same(x, y, "Axpy")
	for i := range ys {
		ys[i] += float32(alpha * xs[i])
	}
}

// Scale sets x *= alpha.
func (d *CPU) Scale(alpha float32, x Buffer) {
	s := d.buf(x).data
	for i := range s {
		s[i] *= alpha
	}
}

// ReLU sets y = max(x, 0). It is branch-free: clearing the bits of every
// value whose sign bit is set maps negatives (and −0) to +0.
func (d *CPU) ReLU(y, x Buffer) {
	o, in := d.same(y, x, "ReLU")
	o = o[:len(in)]
	for i, v := range in {
		u := math.Float32bits(v)
		o[i] = math.Float32frombits(u &^ uint32(int32(u)>>31))
	}
}

// ReLUBackward sets dx = dy where x > 0, else 0, without branches: as int32,
// the bits of x are positive exactly when x > 0 (or x is a positive NaN).
func (d *CPU) ReLUBackward(dx, x, dy Buffer) {
	o, in, g := d.three(dx, x, dy, "ReLUBackward")
	o, g = o[:len(in)], g[:len(in)]
	for i, v := range in {
		k := int32(math.Float32bits(v))
		mask := uint32((-k)>>31) &^ uint32(k>>31)
		o[i] = math.Float32frombits(math.Float32bits(g[i]) & mask)
	}
}

// GELU sets y = x·Φ(x).
func (d *CPU) GELU(y, x Buffer) {
	o, in := d.same(y, x, "GELU")
	for i, v := range in {
		o[i] = GELURef(v)
	}
}

// GELUBackward sets dx = dy·GELU'(x).
func (d *CPU) GELUBackward(dx, x, dy Buffer) {
	o, in, g := d.three(dx, x, dy, "GELUBackward")
	for i, v := range in {
		o[i] = float32(float64(g[i]) * GELUGradRef(v))
	}
}

// GELURef is the reference GELU, x·Φ(x), computed in float64.
func GELURef(x float32) float32 {
	v := float64(x)
	return float32(0.5 * v * (1 + math.Erf(v/math.Sqrt2)))
}

// GELUGradRef is the reference GELU derivative Φ(x) + x·φ(x) in float64.
func GELUGradRef(x float32) float64 {
	v := float64(x)
	cdf := 0.5 * (1 + math.Erf(v/math.Sqrt2))
	pdf := math.Exp(-0.5*v*v) / math.Sqrt(2*math.Pi)
	return cdf + v*pdf
}

// AddBias adds bias to every row of x.
func (d *CPU) AddBias(x Buffer, rows, cols int, bias Buffer) {
	if rows < 0 || cols < 0 {
		panic(fmt.Sprintf("gpu: %s: AddBias rows=%d cols=%d", d.name, rows, cols))
	}
	s := d.at(x, rows*cols, "AddBias x")
	bv := d.at(bias, cols, "AddBias bias")
	for r := 0; r < rows; r++ {
		row := s[r*cols : r*cols+cols]
		for j := range row {
			row[j] += bv[j]
		}
	}
}

// SumRows sets dst[j] = Σ_i x[i][j], rows in order.
func (d *CPU) SumRows(dst, x Buffer, rows, cols int) {
	if rows < 0 || cols < 0 {
		panic(fmt.Sprintf("gpu: %s: SumRows rows=%d cols=%d", d.name, rows, cols))
	}
	s := d.at(x, rows*cols, "SumRows x")
	o := d.at(dst, cols, "SumRows dst")
	clear(o)
	for r := 0; r < rows; r++ {
		row := s[r*cols : r*cols+cols]
		for j := range o {
			o[j] += row[j]
		}
	}
}

// SoftmaxCrossEntropy computes softmax probabilities and per-row losses.
func (d *CPU) SoftmaxCrossEntropy(probs, loss, logits, labels Buffer, rows, cols int) {
	if rows < 0 || cols <= 0 {
		panic(fmt.Sprintf("gpu: %s: SoftmaxCrossEntropy rows=%d cols=%d", d.name, rows, cols))
	}
	p := d.at(probs, rows*cols, "SoftmaxCrossEntropy probs")
	l := d.at(loss, rows, "SoftmaxCrossEntropy loss")
	z := d.at(logits, rows*cols, "SoftmaxCrossEntropy logits")
	y := d.at(labels, rows, "SoftmaxCrossEntropy labels")
	for r := 0; r < rows; r++ {
		zr := z[r*cols : r*cols+cols]
		pr := p[r*cols : r*cols+cols]
		mx := zr[0]
		for _, v := range zr[1:] {
			if v > mx {
				mx = v
			}
		}
		var sum float64
		for j, v := range zr {
			e := math.Exp(float64(v - mx))
			sum += e
			pr[j] = float32(e)
		}
		inv := 1 / sum
		for j := range pr {
			pr[j] = float32(float64(pr[j]) * inv)
		}
		lab := label(y[r], cols, d.name)
		l[r] = float32(math.Log(sum) - float64(zr[lab]-mx))
	}
}

func label(v float32, cols int, name string) int {
	k := int(v)
	if float32(k) != v || k < 0 || k >= cols {
		panic(fmt.Sprintf("gpu: %s: label %v not a class index in [0, %d)", name, v, cols))
	}
	return k
}

// SoftmaxCrossEntropyBackward sets dlogits = scale·(probs − onehot(labels)).
func (d *CPU) SoftmaxCrossEntropyBackward(dlogits, probs, labels Buffer, rows, cols int, scale float32) {
	if rows < 0 || cols <= 0 {
		panic(fmt.Sprintf("gpu: %s: SoftmaxCrossEntropyBackward rows=%d cols=%d", d.name, rows, cols))
	}
	g := d.at(dlogits, rows*cols, "SoftmaxCrossEntropyBackward dlogits")
	p := d.at(probs, rows*cols, "SoftmaxCrossEntropyBackward probs")
	y := d.at(labels, rows, "SoftmaxCrossEntropyBackward labels")
	for r := 0; r < rows; r++ {
		lab := label(y[r], cols, d.name)
		for j := 0; j < cols; j++ {
			v := p[r*cols+j]
			if j == lab {
				v--
			}
			g[r*cols+j] = scale * v
		}
	}
}

// Im2Col gathers convolution patches of the NHWC input into col.
func (d *CPU) Im2Col(col, x Buffer, s ConvShape) {
	K := s.ColCols()
	c := d.at(col, s.ColRows()*K, "Im2Col col")
	in := d.at(x, s.InLen(), "Im2Col x")
	row := 0
	for n := 0; n < s.N; n++ {
		img := in[n*s.H*s.W*s.C : (n+1)*s.H*s.W*s.C]
		for oh := 0; oh < s.OutH; oh++ {
			for ow := 0; ow < s.OutW; ow++ {
				dst := c[row*K : row*K+K]
				row++
				for kh := 0; kh < s.KH; kh++ {
					ih := oh*s.Stride - s.Pad + kh
					seg := dst[kh*s.KW*s.C : (kh+1)*s.KW*s.C]
					if ih < 0 || ih >= s.H {
						clear(seg)
						continue
					}
					for kw := 0; kw < s.KW; kw++ {
						iw := ow*s.Stride - s.Pad + kw
						o := seg[kw*s.C : kw*s.C+s.C]
						if iw < 0 || iw >= s.W {
							clear(o)
							continue
						}
						src := img[(ih*s.W+iw)*s.C : (ih*s.W+iw)*s.C+s.C]
						for c, v := range src { // a loop beats copy for the few channels of early layers
							o[c] = v
						}
					}
				}
			}
		}
	}
}

// Col2Im scatters col back onto the NHWC input gradient dx (zeroed first).
func (d *CPU) Col2Im(dx, col Buffer, s ConvShape) {
	K := s.ColCols()
	c := d.at(col, s.ColRows()*K, "Col2Im col")
	out := d.at(dx, s.InLen(), "Col2Im dx")
	clear(out)
	row := 0
	for n := 0; n < s.N; n++ {
		img := out[n*s.H*s.W*s.C : (n+1)*s.H*s.W*s.C]
		for oh := 0; oh < s.OutH; oh++ {
			for ow := 0; ow < s.OutW; ow++ {
				src := c[row*K : row*K+K]
				row++
				for kh := 0; kh < s.KH; kh++ {
					ih := oh*s.Stride - s.Pad + kh
					if ih < 0 || ih >= s.H {
						continue
					}
					for kw := 0; kw < s.KW; kw++ {
						iw := ow*s.Stride - s.Pad + kw
						if iw < 0 || iw >= s.W {
							continue
						}
						o := img[(ih*s.W+iw)*s.C : (ih*s.W+iw)*s.C+s.C]
						v := src[(kh*s.KW+kw)*s.C : (kh*s.KW+kw)*s.C+s.C]
						for i := range o {
							o[i] += v[i]
						}
					}
				}
			}
		}
	}
}

// MaxPool takes window maxima and records their in-plane positions.
func (d *CPU) MaxPool(y, argmax, x Buffer, s PoolShape) {
	out := d.at(y, s.OutLen(), "MaxPool y")
	am := d.at(argmax, s.OutLen(), "MaxPool argmax")
	in := d.at(x, s.InLen(), "MaxPool x")
	C := s.C
	o := 0
	for n := 0; n < s.N; n++ {
		img := in[n*s.H*s.W*C : (n+1)*s.H*s.W*C]
		for oh := 0; oh < s.OutH; oh++ {
			for ow := 0; ow < s.OutW; ow++ {
				ih0, iw0 := oh*s.Stride, ow*s.Stride
				ov := out[o : o+C]
				oa := am[o : o+C]
				first := img[(ih0*s.W+iw0)*C : (ih0*s.W+iw0)*C+C]
				copy(ov, first)
				pos := float32(ih0*s.W + iw0)
				for c := range oa {
					oa[c] = pos
				}
				for kh := 0; kh < s.K; kh++ {
					for kw := 0; kw < s.K; kw++ {
						if kh == 0 && kw == 0 {
							continue
						}
						p := (ih0+kh)*s.W + iw0 + kw
						v := img[p*C : p*C+C]
						fp := float32(p)
						for c := range ov {
							if v[c] > ov[c] {
								ov[c] = v[c]
								oa[c] = fp
							}
						}
					}
				}
				o += C
			}
		}
	}
}

// MaxPoolBackward routes dy to the recorded maxima in dx (zeroed first).
func (d *CPU) MaxPoolBackward(dx, dy, argmax Buffer, s PoolShape) {
	out := d.at(dx, s.InLen(), "MaxPoolBackward dx")
	g := d.at(dy, s.OutLen(), "MaxPoolBackward dy")
	am := d.at(argmax, s.OutLen(), "MaxPoolBackward argmax")
	clear(out)
	C := s.C
	plane := s.H * s.W
	per := s.OutH * s.OutW * C
	for n := 0; n < s.N; n++ {
		img := out[n*plane*C : (n+1)*plane*C]
		for i := 0; i < per; i++ {
			o := n*per + i
			p := int(am[o])
			if p < 0 || p >= plane {
				panic(fmt.Sprintf("gpu: %s: MaxPoolBackward argmax %v out of range", d.name, am[o]))
			}
			img[p*C+i%C] += g[o]
		}
	}
}

// LayerNorm normalises rows of x.
func (d *CPU) LayerNorm(y, mean, rstd, x, gamma, beta Buffer, rows, cols int, eps float32) {
	out, mu, rs, in, ga, be := LayerNormViews(d.name, d.at, y, mean, rstd, x, gamma, beta, rows, cols)
	for r := 0; r < rows; r++ {
		xr := in[r*cols : r*cols+cols]
		yr := out[r*cols : r*cols+cols]
		var s float64
		for _, v := range xr {
			s += float64(v)
		}
		m := s / float64(cols)
		var ss float64
		for _, v := range xr {
			dv := float64(v) - m
			ss += dv * dv
		}
		rinv := 1 / math.Sqrt(ss/float64(cols)+float64(eps))
		mu[r] = float32(m)
		rs[r] = float32(rinv)
		for j, v := range xr {
			yr[j] = float32((float64(v)-m)*rinv*float64(ga[j]) + float64(be[j]))
		}
	}
}

// LayerNormBackward computes the gradients of LayerNorm.
func (d *CPU) LayerNormBackward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma Buffer, rows, cols int) {
	gx, gg, gb, g, in, mu, rs, ga := LayerNormBackwardViews(d.name, d.at, dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, cols)
	clear(gg)
	clear(gb)
	for r := 0; r < rows; r++ {
		xr := in[r*cols : r*cols+cols]
		gr := g[r*cols : r*cols+cols]
		m, ri := float64(mu[r]), float64(rs[r])
		var sg, sgx float64
		for j, v := range xr {
			xh := (float64(v) - m) * ri
			gy := float64(gr[j])
			gg[j] += float32(gy * xh)
			gb[j] += gr[j]
			gj := gy * float64(ga[j])
			sg += gj
			sgx += gj * xh
		}
		sg /= float64(cols)
		sgx /= float64(cols)
		dr := gx[r*cols : r*cols+cols]
		for j, v := range xr {
			xh := (float64(v) - m) * ri
			gj := float64(gr[j]) * float64(ga[j])
			dr[j] = float32(ri * (gj - sg - xh*sgx))
		}
	}
}

// DropoutMask fills mask with 0 or 1/(1−p) from Uniform(seed, i).
func (d *CPU) DropoutMask(mask Buffer, p float32, seed uint64) {
	if !(p >= 0 && p < 1) {
		panic(fmt.Sprintf("gpu: %s: dropout probability %v not in [0, 1)", d.name, p))
	}
	m := d.buf(mask).data
	keep := 1 / (1 - p)
	for i := range m {
		if Uniform(seed, uint64(i)) >= p {
			m[i] = keep
		} else {
			m[i] = 0
		}
	}
}

// Close does nothing: a CPU device holds no resources beyond Go memory.
func (d *CPU) Close() error { return nil }
