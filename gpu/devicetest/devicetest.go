// Package devicetest is the conformance suite every gpu.Device must pass. It
// checks each kernel against a plain reference loop, checks that outputs are
// written only inside their buffers (guard bands around views), and checks
// that repeating an operation reproduces the same bits.
//
// A device's test calls Run:
//
//	func TestConformance(t *testing.T) {
//		devicetest.Run(t, func() gpu.Device { return gpu.NewCPU(0) })
//	}
package devicetest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// guard is the number of sentinel elements around every view the suite uses.
const guard = 7

// sentinel marks guard elements; a kernel writing out of range changes it.
const sentinel = float32(-12345.5)

// Run runs the whole suite against devices made by open. open is called once
// per subtest.
func Run(t *testing.T, open func() gpu.Device) {
	tests := []struct {
		name string
		fn   func(*testing.T, *env)
	}{
		{"Memory", testMemory},
		{"Gemm", testGemm},
		{"Elementwise", testElementwise},
		{"Activations", testActivations},
		{"BiasAndSumRows", testBias},
		{"SoftmaxCrossEntropy", testSoftmax},
		{"Im2ColCol2Im", testIm2Col},
		{"MaxPool", testMaxPool},
		{"LayerNorm", testLayerNorm},
		{"Embedding", testEmbedding},
		{"CausalSoftmax", testCausalSoftmax},
		{"DropoutMask", testDropout},
		{"Determinism", testDeterminism},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := open()
			e := &env{t: t, d: d, rng: rand.New(rand.NewPCG(1, uint64(len(tc.name))))}
			tc.fn(t, e)
			if err := d.Synchronize(); err != nil {
				t.Fatalf("Synchronize: %v", err)
			}
			e.freeAll()
		})
	}
}

// env wraps a device with helpers that keep guard bands around every buffer.
type env struct {
	t      *testing.T
	d      gpu.Device
	rng    *rand.Rand
	owned  []gpu.Buffer
	guards []guarded
}

type guarded struct {
	base gpu.Buffer
	n    int
}

// buf uploads data into a view surrounded by sentinel guards.
func (e *env) buf(data []float32) gpu.Buffer {
	e.t.Helper()
	n := len(data)
	base, err := e.d.Alloc(n + 2*guard)
	if err != nil {
		e.t.Fatalf("Alloc(%d): %v", n+2*guard, err)
	}
	host := make([]float32, n+2*guard)
	for i := range host {
		host[i] = sentinel
	}
	copy(host[guard:], data)
	e.d.CopyToDevice(base, host)
	e.owned = append(e.owned, base)
	e.guards = append(e.guards, guarded{base, n})
	return e.d.View(base, guard, n)
}

// zeros returns a guarded buffer of n NaNs (so outputs must be written).
func (e *env) out(n int) gpu.Buffer {
	d := make([]float32, n)
	for i := range d {
		d[i] = float32(math.NaN())
	}
	return e.buf(d)
}

func (e *env) get(b gpu.Buffer) []float32 {
	h := make([]float32, b.Len())
	e.d.CopyToHost(h, b)
	return h
}

func (e *env) rand(n int, scale float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = (e.rng.Float32()*2 - 1) * scale
	}
	return s
}

// freeAll checks every guard band and frees the buffers.
func (e *env) freeAll() {
	e.t.Helper()
	for i, g := range e.guards {
		h := make([]float32, g.n+2*guard)
		e.d.CopyToHost(h, g.base)
		for j := 0; j < guard; j++ {
			if h[j] != sentinel || h[guard+g.n+j] != sentinel {
				e.t.Errorf("buffer %d (%d elements): write outside the view (guard %d)", i, g.n, j)
				break
			}
		}
	}
	for _, b := range e.owned {
		e.d.Free(b)
	}
	e.owned, e.guards = nil, nil
}

// near reports whether got matches want within abs + rel·|want| element-wise.
func near(t *testing.T, what string, got, want []float32, abs, rel float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: length %d, want %d", what, len(got), len(want))
	}
	bad := 0
	for i := range got {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(g) != math.IsNaN(w) || math.Abs(g-w) > abs+rel*math.Abs(w) {
			if bad < 5 {
				t.Errorf("%s[%d] = %v, want %v", what, i, got[i], want[i])
			}
			bad++
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d elements wrong", what, bad, len(got))
	}
}

func exact(t *testing.T, what string, got, want []float32) {
	t.Helper()
	near(t, what, got, want, 0, 0)
}

func testMemory(t *testing.T, e *env) {
	if e.d.Name() == "" {
		t.Error("Name() is empty")
	}
	b, err := e.d.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	defer e.d.Free(b)
	if b.Len() != 100 {
		t.Fatalf("Len = %d, want 100", b.Len())
	}
	if got := e.get(b); slices.ContainsFunc(got, func(v float32) bool { return v != 0 }) {
		t.Error("Alloc did not zero the buffer")
	}
	data := e.rand(100, 3)
	e.d.CopyToDevice(b, data)
	exact(t, "round trip", e.get(b), data)

	v := e.d.View(b, 10, 20)
	if v.Len() != 20 {
		t.Fatalf("view Len = %d", v.Len())
	}
	exact(t, "view", e.get(v), data[10:30])
	e.d.Fill(v, 2.5)
	want := slices.Clone(data)
	for i := 10; i < 30; i++ {
		want[i] = 2.5
	}
	exact(t, "Fill through view", e.get(b), want)
	e.d.Fill(v, 0)
	for i := 10; i < 30; i++ {
		want[i] = 0
	}
	exact(t, "Fill 0", e.get(b), want)

	src := e.buf(e.rand(20, 1))
	dst := e.out(20)
	e.d.Copy(dst, src)
	exact(t, "Copy", e.get(dst), e.get(src))

	// Partial copies touch only the prefix.
	part := []float32{9, 8, 7}
	e.d.CopyToDevice(dst, part)
	got := e.get(dst)
	exact(t, "partial CopyToDevice", got[:3], part)
	exact(t, "partial CopyToDevice rest", got[3:], e.get(src)[3:])
	h := make([]float32, 2)
	e.d.CopyToHost(h, dst)
	exact(t, "partial CopyToHost", h, part[:2])

	z, err := e.d.Alloc(0)
	if err != nil {
		t.Fatalf("Alloc(0): %v", err)
	}
	e.d.Free(z)
	if _, err := e.d.Alloc(-1); err == nil {
		t.Error("Alloc(-1) succeeded")
	}
}

func refGemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) []float32 {
	out := slices.Clone(c)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for l := 0; l < k; l++ {
				var x, y float32
				if tA {
					x = a[l*lda+i]
				} else {
					x = a[i*lda+l]
				}
				if tB {
					y = b[j*ldb+l]
				} else {
					y = b[l*ldb+j]
				}
				s += float64(x) * float64(y)
			}
			v := float64(alpha) * s
			if beta != 0 {
				v += float64(beta) * float64(c[i*ldc+j])
			}
			out[i*ldc+j] = float32(v)
		}
	}
	return out
}

func testGemm(t *testing.T, e *env) {
	type tc struct {
		m, n, k     int
		tA, tB      bool
		alpha, beta float32
		pad         int // extra stride
	}
	var cases []tc
	// The last two shapes are large enough for blocked and multi-threaded
	// kernels to split them, tall and wide.
	for _, dims := range [][3]int{{1, 1, 1}, {3, 5, 7}, {17, 9, 33}, {64, 65, 31}, {0, 4, 3}, {4, 0, 3}, {5, 6, 0}, {301, 150, 130}, {150, 301, 130}} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			cases = append(cases, tc{dims[0], dims[1], dims[2], tr[0], tr[1], 1, 0, 0})
		}
	}
	cases = append(cases,
		tc{13, 11, 19, false, true, 0.5, 1, 3},
		tc{13, 11, 19, true, false, -2, 0.25, 1},
		tc{128, 96, 200, false, false, 1, 1, 0},
		tc{96, 128, 70, true, true, 1.5, -1, 5},
	)
	for _, c := range cases {
		t.Run(fmt.Sprintf("%dx%dx%d_tA=%v_tB=%v_a=%v_b=%v", c.m, c.n, c.k, c.tA, c.tB, c.alpha, c.beta), func(t *testing.T) {
			ar, ac := c.m, c.k
			if c.tA {
				ar, ac = c.k, c.m
			}
			br, bc := c.k, c.n
			if c.tB {
				br, bc = c.n, c.k
			}
			lda, ldb, ldc := ac+c.pad, bc+c.pad, c.n+c.pad
			a := e.rand(max(ar*lda, 1), 1)
			b := e.rand(max(br*ldb, 1), 1)
			cc := e.rand(max(c.m*ldc, 1), 1)
			if c.beta == 0 {
				for i := range cc {
					cc[i] = float32(math.NaN()) // beta == 0 must ignore C
				}
			}
			want := refGemm(c.tA, c.tB, c.m, c.n, c.k, c.alpha, a, max(lda, 1), b, max(ldb, 1), c.beta, cc, max(ldc, 1))
			if c.beta == 0 {
				// Padding columns keep their NaN; compare only m×n.
				for i := range want {
					if c.n == 0 || i/max(ldc, 1) >= c.m || i%max(ldc, 1) >= c.n {
						want[i] = float32(math.NaN())
					}
				}
			}
			cb := e.buf(cc)
			e.d.Gemm(c.tA, c.tB, c.m, c.n, c.k, c.alpha, e.buf(a), max(lda, 1), e.buf(b), max(ldb, 1), c.beta, cb, max(ldc, 1))
			near(t, "C", e.get(cb), want, 1e-5*float64(c.k+1), 1e-5)
		})
	}
}

func testElementwise(t *testing.T, e *env) {
	for _, n := range []int{1, 7, 1000} {
		a, b := e.rand(n, 4), e.rand(n, 4)
		ab, bb := e.buf(a), e.buf(b)
		dst := e.out(n)

		want := make([]float32, n)
		for i := range want {
			want[i] = a[i] + b[i]
		}
		e.d.Add(dst, ab, bb)
		exact(t, "Add", e.get(dst), want)

		for i := range want {
			want[i] = a[i] * b[i]
		}
		e.d.Mul(dst, ab, bb)
		exact(t, "Mul", e.get(dst), want)

		// Aliasing: dst = a.
		al := e.buf(a)
		e.d.Add(al, al, bb)
		for i := range want {
			want[i] = a[i] + b[i]
		}
		exact(t, "Add aliased", e.get(al), want)

		y := e.buf(b)
		e.d.Axpy(-0.75, ab, y)
		for i := range want {
			want[i] = b[i] + float32(-0.75*a[i])
		}
		exact(t, "Axpy", e.get(y), want)

		e.d.Scale(3, y)
		for i := range want {
			want[i] *= 3
		}
		exact(t, "Scale", e.get(y), want)
	}
}

func testActivations(t *testing.T, e *env) {
	n := 513
	x, dy := e.rand(n, 5), e.rand(n, 2)
	x[0], x[1] = 0, float32(math.Copysign(0, -1))
	xb, dyb := e.buf(x), e.buf(dy)

	y := e.out(n)
	e.d.ReLU(y, xb)
	want := make([]float32, n)
	for i, v := range x {
		want[i] = max(v, 0)
		if v <= 0 {
			want[i] = 0
		}
	}
	exact(t, "ReLU", e.get(y), want)

	dx := e.out(n)
	e.d.ReLUBackward(dx, xb, dyb)
	for i, v := range x {
		want[i] = 0
		if v > 0 {
			want[i] = dy[i]
		}
	}
	exact(t, "ReLUBackward", e.get(dx), want)

	e.d.GELU(y, xb)
	for i, v := range x {
		vf := float64(v)
		want[i] = float32(0.5 * vf * (1 + math.Erf(vf/math.Sqrt2)))
	}
	near(t, "GELU", e.get(y), want, 1e-6, 1e-5)

	e.d.GELUBackward(dx, xb, dyb)
	for i, v := range x {
		// Numerical derivative of the float64 GELU as an independent check.
		h := 1e-6
		f := func(z float64) float64 { return 0.5 * z * (1 + math.Erf(z/math.Sqrt2)) }
		vf := float64(v)
		want[i] = float32(float64(dy[i]) * (f(vf+h) - f(vf-h)) / (2 * h))
	}
	near(t, "GELUBackward", e.get(dx), want, 1e-5, 1e-4)

	// In place.
	ip := e.buf(x)
	e.d.ReLU(ip, ip)
	e.d.ReLU(y, xb)
	exact(t, "ReLU in place", e.get(ip), e.get(y))
}

func testBias(t *testing.T, e *env) {
	for _, sh := range [][2]int{{1, 1}, {5, 3}, {64, 129}, {0, 4}} {
		rows, cols := sh[0], sh[1]
		x, bias := e.rand(rows*cols, 2), e.rand(cols, 1)
		xb := e.buf(x)
		e.d.AddBias(xb, rows, cols, e.buf(bias))
		want := slices.Clone(x)
		for i := range want {
			want[i] += bias[i%cols]
		}
		exact(t, "AddBias", e.get(xb), want)

		dst := e.out(cols)
		e.d.SumRows(dst, e.buf(x), rows, cols)
		ws := make([]float32, cols)
		for j := range ws {
			var s float64
			for i := 0; i < rows; i++ {
				s += float64(x[i*cols+j])
			}
			ws[j] = float32(s)
		}
		near(t, "SumRows", e.get(dst), ws, 1e-5*float64(rows+1), 1e-5)
	}
}

func testSoftmax(t *testing.T, e *env) {
	rows, cols := 37, 10
	z := e.rand(rows*cols, 8)
	z[3] = 80 // large logits must not overflow
	z[4] = 79
	labels := make([]float32, rows)
	for i := range labels {
		labels[i] = float32(e.rng.IntN(cols))
	}
	probs, loss := e.out(rows*cols), e.out(rows)
	zb, lb := e.buf(z), e.buf(labels)
	e.d.SoftmaxCrossEntropy(probs, loss, zb, lb, rows, cols)
	wp := make([]float32, rows*cols)
	wl := make([]float32, rows)
	for r := 0; r < rows; r++ {
		mx := math.Inf(-1)
		for j := 0; j < cols; j++ {
			mx = math.Max(mx, float64(z[r*cols+j]))
		}
		var s float64
		for j := 0; j < cols; j++ {
			s += math.Exp(float64(z[r*cols+j]) - mx)
		}
		for j := 0; j < cols; j++ {
			wp[r*cols+j] = float32(math.Exp(float64(z[r*cols+j])-mx) / s)
		}
		wl[r] = float32(math.Log(s) + mx - float64(z[r*cols+int(labels[r])]))
	}
	near(t, "probs", e.get(probs), wp, 1e-6, 1e-5)
	near(t, "loss", e.get(loss), wl, 1e-5, 1e-5)

	dz := e.out(rows * cols)
	scale := float32(1.0 / rows)
	e.d.SoftmaxCrossEntropyBackward(dz, probs, lb, rows, cols, scale)
	p := e.get(probs)
	wd := make([]float32, rows*cols)
	for r := 0; r < rows; r++ {
		for j := 0; j < cols; j++ {
			v := float64(p[r*cols+j])
			if j == int(labels[r]) {
				v--
			}
			wd[r*cols+j] = float32(float64(scale) * v)
		}
	}
	near(t, "dlogits", e.get(dz), wd, 1e-7, 1e-5)
}

func refIm2Col(x []float32, s gpu.ConvShape) []float32 {
	K := s.ColCols()
	col := make([]float32, s.ColRows()*K)
	for n := 0; n < s.N; n++ {
		for oh := 0; oh < s.OutH; oh++ {
			for ow := 0; ow < s.OutW; ow++ {
				row := (n*s.OutH+oh)*s.OutW + ow
				for kh := 0; kh < s.KH; kh++ {
					for kw := 0; kw < s.KW; kw++ {
						for c := 0; c < s.C; c++ {
							ih, iw := oh*s.Stride-s.Pad+kh, ow*s.Stride-s.Pad+kw
							var v float32
							if ih >= 0 && ih < s.H && iw >= 0 && iw < s.W {
								v = x[((n*s.H+ih)*s.W+iw)*s.C+c]
							}
							col[row*K+(kh*s.KW+kw)*s.C+c] = v
						}
					}
				}
			}
		}
	}
	return col
}

func testIm2Col(t *testing.T, e *env) {
	geoms := [][8]int{ // n h w c kh kw stride pad
		{2, 5, 5, 1, 3, 3, 1, 1},
		{3, 7, 6, 4, 3, 3, 1, 1},
		{1, 8, 8, 3, 2, 2, 2, 0},
		{2, 9, 7, 2, 3, 2, 2, 1},
		{1, 4, 4, 5, 1, 1, 1, 0},
	}
	for _, g := range geoms {
		s, err := gpu.NewConvShape(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7])
		if err != nil {
			t.Fatal(err)
		}
		x := e.rand(s.InLen(), 1)
		col := e.out(s.ColRows() * s.ColCols())
		e.d.Im2Col(col, e.buf(x), s)
		exact(t, fmt.Sprintf("Im2Col %+v", s), e.get(col), refIm2Col(x, s))

		// Col2Im is the adjoint: <Im2Col(x), c> == <x, Col2Im(c)>, and with
		// integer-valued col the sums are exact.
		cv := make([]float32, s.ColRows()*s.ColCols())
		for i := range cv {
			cv[i] = float32(e.rng.IntN(9) - 4)
		}
		dx := e.out(s.InLen())
		e.d.Col2Im(dx, e.buf(cv), s)
		want := make([]float32, s.InLen())
		K := s.ColCols()
		for n := 0; n < s.N; n++ {
			for oh := 0; oh < s.OutH; oh++ {
				for ow := 0; ow < s.OutW; ow++ {
					row := (n*s.OutH+oh)*s.OutW + ow
					for kh := 0; kh < s.KH; kh++ {
						for kw := 0; kw < s.KW; kw++ {
							ih, iw := oh*s.Stride-s.Pad+kh, ow*s.Stride-s.Pad+kw
							if ih < 0 || ih >= s.H || iw < 0 || iw >= s.W {
								continue
							}
							for c := 0; c < s.C; c++ {
								want[((n*s.H+ih)*s.W+iw)*s.C+c] += cv[row*K+(kh*s.KW+kw)*s.C+c]
							}
						}
					}
				}
			}
		}
		exact(t, fmt.Sprintf("Col2Im %+v", s), e.get(dx), want)
	}
	if _, err := gpu.NewConvShape(1, 2, 2, 1, 5, 5, 1, 0); err == nil {
		t.Error("NewConvShape accepted a kernel larger than the input")
	}
}

func testMaxPool(t *testing.T, e *env) {
	geoms := [][6]int{{2, 4, 4, 3, 2, 2}, {1, 5, 7, 2, 2, 2}, {2, 6, 6, 1, 3, 2}, {1, 3, 3, 4, 3, 1}}
	for _, g := range geoms {
		s, err := gpu.NewPoolShape(g[0], g[1], g[2], g[3], g[4], g[5])
		if err != nil {
			t.Fatal(err)
		}
		x := e.rand(s.InLen(), 1)
		// Ties: the first maximum in scan order wins.
		if s.InLen() > 8 {
			x[0], x[s.C] = 5, 5
		}
		y, am := e.out(s.OutLen()), e.out(s.OutLen())
		e.d.MaxPool(y, am, e.buf(x), s)
		wy := make([]float32, s.OutLen())
		wa := make([]float32, s.OutLen())
		for n := 0; n < s.N; n++ {
			for oh := 0; oh < s.OutH; oh++ {
				for ow := 0; ow < s.OutW; ow++ {
					for c := 0; c < s.C; c++ {
						best, pos := float32(math.Inf(-1)), -1
						for kh := 0; kh < s.K; kh++ {
							for kw := 0; kw < s.K; kw++ {
								ih, iw := oh*s.Stride+kh, ow*s.Stride+kw
								v := x[((n*s.H+ih)*s.W+iw)*s.C+c]
								if pos < 0 || v > best {
									best, pos = v, ih*s.W+iw
								}
							}
						}
						o := ((n*s.OutH+oh)*s.OutW+ow)*s.C + c
						wy[o], wa[o] = best, float32(pos)
					}
				}
			}
		}
		exact(t, "MaxPool y", e.get(y), wy)
		exact(t, "MaxPool argmax", e.get(am), wa)

		dy := make([]float32, s.OutLen())
		for i := range dy {
			dy[i] = float32(e.rng.IntN(9) - 4)
		}
		dx := e.out(s.InLen())
		e.d.MaxPoolBackward(dx, e.buf(dy), am, s)
		wd := make([]float32, s.InLen())
		for n := 0; n < s.N; n++ {
			for i := 0; i < s.OutH*s.OutW*s.C; i++ {
				o := n*s.OutH*s.OutW*s.C + i
				wd[(n*s.H*s.W+int(wa[o]))*s.C+i%s.C] += dy[o]
			}
		}
		exact(t, "MaxPoolBackward", e.get(dx), wd)
	}
}

func testLayerNorm(t *testing.T, e *env) {
	rows, cols := 9, 33
	eps := float32(1e-5)
	x, gamma, beta, dy := e.rand(rows*cols, 3), e.rand(cols, 2), e.rand(cols, 1), e.rand(rows*cols, 1)
	for i := range x {
		x[i] += 1.5 // a non-zero mean
	}
	xb, gb, bb := e.buf(x), e.buf(gamma), e.buf(beta)
	y, mean, rstd := e.out(rows*cols), e.out(rows), e.out(rows)
	e.d.LayerNorm(y, mean, rstd, xb, gb, bb, rows, cols, eps)
	wy := make([]float32, rows*cols)
	wm, wr := make([]float32, rows), make([]float32, rows)
	xh := make([]float64, rows*cols)
	for r := 0; r < rows; r++ {
		var m, v float64
		for j := 0; j < cols; j++ {
			m += float64(x[r*cols+j])
		}
		m /= float64(cols)
		for j := 0; j < cols; j++ {
			d := float64(x[r*cols+j]) - m
			v += d * d
		}
		ri := 1 / math.Sqrt(v/float64(cols)+float64(eps))
		wm[r], wr[r] = float32(m), float32(ri)
		for j := 0; j < cols; j++ {
			xh[r*cols+j] = (float64(x[r*cols+j]) - m) * ri
			wy[r*cols+j] = float32(xh[r*cols+j]*float64(gamma[j]) + float64(beta[j]))
		}
	}
	near(t, "LayerNorm y", e.get(y), wy, 1e-5, 1e-5)
	near(t, "LayerNorm mean", e.get(mean), wm, 1e-6, 1e-6)
	near(t, "LayerNorm rstd", e.get(rstd), wr, 1e-6, 1e-5)

	dx, dg, db := e.out(rows*cols), e.out(cols), e.out(cols)
	e.d.LayerNormBackward(dx, dg, db, e.buf(dy), xb, mean, rstd, gb, rows, cols)
	wdx := make([]float32, rows*cols)
	wdg, wdb := make([]float32, cols), make([]float32, cols)
	for j := 0; j < cols; j++ {
		var sg, sb float64
		for r := 0; r < rows; r++ {
			sg += float64(dy[r*cols+j]) * xh[r*cols+j]
			sb += float64(dy[r*cols+j])
		}
		wdg[j], wdb[j] = float32(sg), float32(sb)
	}
	for r := 0; r < rows; r++ {
		var s1, s2 float64
		for j := 0; j < cols; j++ {
			g := float64(dy[r*cols+j]) * float64(gamma[j])
			s1 += g
			s2 += g * xh[r*cols+j]
		}
		s1 /= float64(cols)
		s2 /= float64(cols)
		for j := 0; j < cols; j++ {
			g := float64(dy[r*cols+j]) * float64(gamma[j])
			wdx[r*cols+j] = float32(float64(wr[r]) * (g - s1 - xh[r*cols+j]*s2))
		}
	}
	near(t, "LayerNorm dx", e.get(dx), wdx, 1e-4, 1e-4)
	near(t, "LayerNorm dgamma", e.get(dg), wdg, 1e-4, 1e-4)
	near(t, "LayerNorm dbeta", e.get(db), wdb, 1e-5, 1e-5)
}

// tokens returns n random token indices below vocab, as float32.
func (e *env) tokens(n, vocab int) []float32 {
	ids := make([]float32, n)
	for i := range ids {
		ids[i] = float32(e.rng.IntN(vocab))
	}
	return ids
}

func testEmbedding(t *testing.T, e *env) {
	rows, vocab, dim := 37, 11, 13
	ids := e.tokens(rows, vocab)
	ids[0], ids[rows-1] = 0, float32(vocab-1) // both ends of the table
	table := e.rand(vocab*dim, 2)
	tb, ib := e.buf(table), e.buf(ids)
	y := e.out(rows * dim)
	e.d.Embedding(y, tb, ib, rows, vocab, dim)
	wy := make([]float32, rows*dim)
	for i := 0; i < rows; i++ {
		copy(wy[i*dim:(i+1)*dim], table[int(ids[i])*dim:])
	}
	exact(t, "Embedding y", e.get(y), wy)

	// The backward pass adds to what dtable holds, token rows in order, so
	// repeated tokens sum in a fixed order and the result is exact.
	dy, dt0 := e.rand(rows*dim, 1), e.rand(vocab*dim, 1)
	dt := e.buf(dt0)
	e.d.EmbeddingBackward(dt, ib, e.buf(dy), rows, vocab, dim)
	wdt := slices.Clone(dt0)
	for i := 0; i < rows; i++ {
		k := int(ids[i])
		for j := 0; j < dim; j++ {
			wdt[k*dim+j] += dy[i*dim+j]
		}
	}
	exact(t, "EmbeddingBackward dtable", e.get(dt), wdt)

	// No rows: nothing is written, nothing is read.
	e.d.Embedding(e.out(0), tb, e.buf(nil), 0, vocab, dim)
	e.d.EmbeddingBackward(dt, e.buf(nil), e.buf(nil), 0, vocab, dim)
	exact(t, "EmbeddingBackward of no rows", e.get(dt), wdt)
}

// refCausalSoftmax is CausalSoftmax's reference loop in float64.
func refCausalSoftmax(x []float32, blocks, T int, scale float32) []float32 {
	y := make([]float32, len(x))
	for r := 0; r < blocks*T; r++ {
		i := r % T
		m := math.Inf(-1)
		for j := 0; j <= i; j++ {
			m = math.Max(m, float64(scale)*float64(x[r*T+j]))
		}
		var s float64
		for j := 0; j <= i; j++ {
			s += math.Exp(float64(scale)*float64(x[r*T+j]) - m)
		}
		for j := 0; j <= i; j++ {
			y[r*T+j] = float32(math.Exp(float64(scale)*float64(x[r*T+j])-m) / s)
		}
	}
	return y
}

func testCausalSoftmax(t *testing.T, e *env) {
	blocks, T := 5, 9
	scale := float32(0.35)
	n := blocks * T * T
	x := e.rand(n, 8)
	x[3*T+1] = 300 // a large score must not overflow
	xb := e.buf(x)
	y := e.out(n)
	e.d.CausalSoftmax(y, xb, blocks, T, scale)
	wy := refCausalSoftmax(x, blocks, T, scale)
	got := e.get(y)
	near(t, "CausalSoftmax y", got, wy, 1e-7, 1e-6)
	for r := 0; r < blocks*T; r++ {
		var s float64
		for j := 0; j < T; j++ {
			if j > r%T && got[r*T+j] != 0 {
				t.Fatalf("CausalSoftmax row %d column %d = %v above the diagonal, want 0", r, j, got[r*T+j])
			}
			s += float64(got[r*T+j])
		}
		if math.Abs(s-1) > 1e-5 {
			t.Errorf("CausalSoftmax row %d sums to %v", r, s)
		}
	}

	dy := e.rand(n, 1)
	dx := e.out(n)
	e.d.CausalSoftmaxBackward(dx, y, e.buf(dy), blocks, T, scale)
	wdx := make([]float32, n)
	for r := 0; r < blocks*T; r++ {
		i := r % T
		var dot float64
		for j := 0; j <= i; j++ {
			dot += float64(got[r*T+j]) * float64(dy[r*T+j])
		}
		for j := 0; j <= i; j++ {
			wdx[r*T+j] = float32(float64(scale) * float64(got[r*T+j]) * (float64(dy[r*T+j]) - dot))
		}
	}
	near(t, "CausalSoftmaxBackward dx", e.get(dx), wdx, 1e-7, 1e-5)

	// In place: y over x, dx over dy.
	xa := e.buf(x)
	e.d.CausalSoftmax(xa, xa, blocks, T, scale)
	exact(t, "CausalSoftmax in place", e.get(xa), got)
	da := e.buf(dy)
	e.d.CausalSoftmaxBackward(da, y, da, blocks, T, scale)
	exact(t, "CausalSoftmaxBackward in place", e.get(da), e.get(dx))
}

func testDropout(t *testing.T, e *env) {
	n := 10000
	for _, p := range []float32{0, 0.25, 0.5} {
		m := e.out(n)
		e.d.DropoutMask(m, p, 42)
		want := make([]float32, n)
		kept := 0
		for i := range want {
			if gpu.Uniform(42, uint64(i)) >= p {
				want[i] = 1 / (1 - p)
				kept++
			}
		}
		exact(t, fmt.Sprintf("DropoutMask p=%v", p), e.get(m), want)
		if frac := float64(kept) / float64(n); math.Abs(frac-float64(1-p)) > 0.03 {
			t.Errorf("p=%v: kept fraction %v", p, frac)
		}
	}
	a, b := e.out(64), e.out(64)
	e.d.DropoutMask(a, 0.5, 1)
	e.d.DropoutMask(b, 0.5, 2)
	if slices.Equal(e.get(a), e.get(b)) {
		t.Error("different seeds gave the same mask")
	}
}

// testDeterminism runs a small chain of kernels twice and requires equal bits.
func testDeterminism(t *testing.T, e *env) {
	run := func() []float32 {
		s, _ := gpu.NewConvShape(4, 8, 8, 3, 3, 3, 1, 1)
		x := e.buf(e.rand(s.InLen(), 1))
		w := e.buf(e.rand(16*s.ColCols(), 0.3))
		col := e.out(s.ColRows() * s.ColCols())
		e.d.Im2Col(col, x, s)
		y := e.out(s.ColRows() * 16)
		e.d.Gemm(false, true, s.ColRows(), 16, s.ColCols(), 1, col, s.ColCols(), w, s.ColCols(), 0, y, 16)
		e.d.GELU(y, y)
		sum := e.out(16)
		e.d.SumRows(sum, y, s.ColRows(), 16)
		dw := e.out(16 * s.ColCols())
		e.d.Gemm(true, false, 16, s.ColCols(), s.ColRows(), 1, y, 16, col, s.ColCols(), 0, dw, s.ColCols())
		return append(e.get(sum), e.get(dw)...)
	}
	seed := e.rng.Uint64()
	e.rng = rand.New(rand.NewPCG(seed, 0))
	a := run()
	e.rng = rand.New(rand.NewPCG(seed, 0))
	b := run()
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("element %d differs between identical runs: %v vs %v", i, a[i], b[i])
		}
	}
}
