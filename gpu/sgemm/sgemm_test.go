package sgemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// config is a micro-kernel and a packing mode this build can run.
type config struct {
	name    string
	kernel  kernelFunc
	asmPack bool
}

// kernels lists the configurations this build can run: pure Go, and assembly
// where the CPU supports it.
func kernels() []config {
	ks := []config{{"go", kernelGo, false}}
	if asmKernel != nil {
		ks = append(ks, config{"asm", asmKernel, true})
	}
	return ks
}

// withKernel runs f with the micro-kernel and packing mode of k.
func withKernel(k config, f func()) {
	oldKernel, oldPack := microKernel, asmPack
	microKernel, asmPack = k.kernel, k.asmPack
	defer func() { microKernel, asmPack = oldKernel, oldPack }()
	f()
}

const guard = 13 // guard elements on each side of C

// guardValue fills guard bands and stride gaps; a write out of range changes it.
var guardValue = math.Float32frombits(0x7fc0dead) // a NaN with a payload

// matrix is a row-major r×c matrix with row stride ld inside data, which has
// guard bands around it.
type matrix struct {
	r, c, ld int
	data     []float32
}

func newMatrix(rnd *rand.Rand, r, c, ld int, ints bool) matrix {
	size := 0
	if r > 0 && c > 0 {
		size = (r-1)*ld + c
	}
	mt := matrix{r: r, c: c, ld: ld, data: make([]float32, size+2*guard)}
	for i := range mt.data {
		mt.data[i] = guardValue
	}
	for i := 0; i < r; i++ {
		for j := 0; j < c; j++ {
			mt.data[guard+i*ld+j] = randValue(rnd, ints)
		}
	}
	return mt
}

func randValue(rnd *rand.Rand, ints bool) float32 {
	if ints {
		return float32(rnd.IntN(7) - 3)
	}
	return float32(rnd.NormFloat64())
}

func (mt matrix) view() []float32 {
	if mt.r == 0 || mt.c == 0 {
		return mt.data[guard:guard]
	}
	return mt.data[guard : len(mt.data)-guard]
}

func (mt matrix) at(i, j int) float32 { return mt.data[guard+i*mt.ld+j] }

func (mt matrix) clone() matrix {
	mt.data = append([]float32(nil), mt.data...)
	return mt
}

// checkGuards reports any change outside the r×c elements of mt.
func checkGuards(t *testing.T, name string, mt, orig matrix) {
	t.Helper()
	inside := func(idx int) bool {
		idx -= guard
		if idx < 0 || mt.r == 0 || mt.c == 0 || idx >= (mt.r-1)*mt.ld+mt.c {
			return false
		}
		return idx%mt.ld < mt.c
	}
	for idx := range mt.data {
		if !inside(idx) && math.Float32bits(mt.data[idx]) != math.Float32bits(orig.data[idx]) {
			t.Fatalf("%s: element %d outside the matrix changed to %v", name, idx-guard, mt.data[idx])
		}
	}
}

type shape struct {
	transA, transB bool
	m, n, k        int
	pad            int // extra stride beyond the columns
	alpha, beta    float32
}

func (s shape) String() string {
	t := func(b bool) string {
		if b {
			return "T"
		}
		return "N"
	}
	return fmt.Sprintf("%s%s/m=%d,n=%d,k=%d,pad=%d,alpha=%v,beta=%v", t(s.transA), t(s.transB), s.m, s.n, s.k, s.pad, s.alpha, s.beta)
}

// operands builds A, B and C for s; with beta = 0, C starts as NaN garbage.
func (s shape) operands(rnd *rand.Rand, ints bool) (a, b, c matrix) {
	ar, ac := s.m, s.k
	if s.transA {
		ar, ac = s.k, s.m
	}
	br, bc := s.k, s.n
	if s.transB {
		br, bc = s.n, s.k
	}
	a = newMatrix(rnd, ar, ac, ac+s.pad, ints)
	b = newMatrix(rnd, br, bc, bc+2*s.pad, ints)
	c = newMatrix(rnd, s.m, s.n, s.n+3*s.pad, ints)
	if s.beta == 0 {
		for i := 0; i < s.m; i++ {
			for j := 0; j < s.n; j++ {
				c.data[guard+i*c.ld+j] = float32(math.NaN())
			}
		}
	}
	return a, b, c
}

func (s shape) run(a, b, c matrix) {
	Sgemm(s.transA, s.transB, s.m, s.n, s.k, s.alpha, a.view(), a.ld, b.view(), b.ld, s.beta, c.view(), c.ld)
}

// want returns the float64 result of s and a bound on its float32 rounding error.
func (s shape) want(a, b, c matrix, i, j int) (v, tol float64) {
	var sum, mag float64
	for l := 0; l < s.k; l++ {
		var x, y float32
		if s.transA {
			x = a.at(l, i)
		} else {
			x = a.at(i, l)
		}
		if s.transB {
			y = b.at(j, l)
		} else {
			y = b.at(l, j)
		}
		sum += float64(x) * float64(y)
		mag += math.Abs(float64(x) * float64(y))
	}
	alpha, beta := float64(s.alpha), float64(s.beta)
	v = alpha * sum
	mag = math.Abs(alpha) * mag
	if s.beta != 0 {
		v += beta * float64(c.at(i, j))
		mag += math.Abs(beta * float64(c.at(i, j)))
	}
	const eps = 1.0 / (1 << 23)
	return v, float64(s.k+3)*eps*mag + 1e-30
}

func shapes() []shape {
	sizes := []int{1, 2, 3, 5, 6, 7, 13, 16, 17, 31, 47, 70}
	var out []shape
	i := 0
	for _, m := range sizes {
		for _, n := range sizes {
			for _, k := range sizes {
				for tr := 0; tr < 4; tr++ {
					ab := [][2]float32{{1, 0}, {1, 1}, {-0.5, 2}, {2, 0}, {0.25, -1}}[i%5]
					out = append(out, shape{transA: tr&1 != 0, transB: tr&2 != 0, m: m, n: n, k: k, pad: i % 3, alpha: ab[0], beta: ab[1]})
					i++
				}
			}
		}
	}
	// Shapes that cross the cache-block boundaries.
	for tr := 0; tr < 4; tr++ {
		for _, d := range [][3]int{{130, 40, 300}, {250, 33, 257}, {7, 4100, 3}, {121, 17, 513}, {mcBlock, nr, kcBlock}} {
			out = append(out, shape{transA: tr&1 != 0, transB: tr&2 != 0, m: d[0], n: d[1], k: d[2], pad: tr, alpha: 1.5, beta: float32(tr % 2)})
		}
	}
	return out
}

// TestSgemmShapes compares every kernel with a float64 reference, within a
// rounding bound, over many shapes, transposes, strides and alpha/beta values,
// checking that nothing outside C is written and A and B are not modified.
func TestSgemmShapes(t *testing.T) {
	for _, kn := range kernels() {
		t.Run(kn.name, func(t *testing.T) {
			withKernel(kn, func() {
				rnd := rand.New(rand.NewPCG(1, 2))
				for _, s := range shapes() {
					a, b, c := s.operands(rnd, false)
					a0, b0, c0 := a.clone(), b.clone(), c.clone()
					s.run(a, b, c)
					checkGuards(t, s.String()+" C", c, c0)
					for idx := range a.data {
						if math.Float32bits(a.data[idx]) != math.Float32bits(a0.data[idx]) {
							t.Fatalf("%v: A modified", s)
						}
					}
					for idx := range b.data {
						if math.Float32bits(b.data[idx]) != math.Float32bits(b0.data[idx]) {
							t.Fatalf("%v: B modified", s)
						}
					}
					for i := 0; i < s.m; i++ {
						for j := 0; j < s.n; j++ {
							want, tol := s.want(a, b, c0, i, j)
							got := float64(c.at(i, j))
							if !(math.Abs(got-want) <= tol) {
								t.Fatalf("%v: C[%d][%d] = %v, want %v ± %g", s, i, j, got, want, tol)
							}
						}
					}
				}
			})
		})
	}
}

// TestSgemmExact uses small-integer matrices, whose products and sums are exact
// in float32, so every kernel must match the reference loop bit for bit.
func TestSgemmExact(t *testing.T) {
	for _, kn := range kernels() {
		t.Run(kn.name, func(t *testing.T) {
			withKernel(kn, func() {
				rnd := rand.New(rand.NewPCG(3, 4))
				for _, s := range shapes() {
					if s.beta != 0 {
						s.alpha = 2
					}
					a, b, c := s.operands(rnd, true)
					ref := c.clone()
					s.run(a, b, c)
					reference(s.transA, s.transB, s.m, s.n, s.k, s.alpha, a.view(), a.ld, b.view(), b.ld, s.beta, ref.view(), ref.ld)
					for idx := range c.data {
						if math.Float32bits(c.data[idx]) != math.Float32bits(ref.data[idx]) {
							t.Fatalf("%v: element %d = %v, reference %v", s, idx-guard, c.data[idx], ref.data[idx])
						}
					}
				}
			})
		})
	}
}

// model is the blocked algorithm's arithmetic written as a plain loop, with
// each product rounded before it is added: the pure-Go kernel must match it
// bit for bit.
func model(s shape, a, b, c matrix) {
	kcb := split(s.k, kcBlock, 1)
	for i := 0; i < s.m; i++ {
		for j := 0; j < s.n; j++ {
			dst := &c.data[guard+i*c.ld+j]
			for pc := 0; pc < s.k; pc += kcb {
				var sum float32
				for l := pc; l < min(pc+kcb, s.k); l++ {
					var x, y float32
					if s.transA {
						x = a.at(l, i)
					} else {
						x = a.at(i, l)
					}
					if s.transB {
						y = b.at(j, l)
					} else {
						y = b.at(l, j)
					}
					sum += float32(x * y)
				}
				switch {
				case pc > 0:
					*dst = float32(s.alpha*sum) + *dst
				case s.beta == 0:
					*dst = s.alpha * sum
				default:
					*dst = float32(s.alpha*sum) + float32(s.beta**dst)
				}
			}
		}
	}
}

// TestSgemmGoModel checks the pure-Go path bit for bit against model, for
// products large enough to take the blocked path.
func TestSgemmGoModel(t *testing.T) {
	withKernel(kernels()[0], func() {
		rnd := rand.New(rand.NewPCG(5, 6))
		for _, s := range shapes() {
			if s.m*s.n*s.k <= smallWork {
				continue
			}
			a, b, c := s.operands(rnd, false)
			want := c.clone()
			s.run(a, b, c)
			model(s, a, b, want)
			for idx := range c.data {
				if math.Float32bits(c.data[idx]) != math.Float32bits(want.data[idx]) {
					t.Fatalf("%v: element %d = %v, model %v", s, idx-guard, c.data[idx], want.data[idx])
				}
			}
		}
	})
}

// TestSgemmDeterministic checks that repeated calls, and calls on copies of
// the operands at other offsets in memory, give the same bits.
func TestSgemmDeterministic(t *testing.T) {
	for _, kn := range kernels() {
		t.Run(kn.name, func(t *testing.T) {
			withKernel(kn, func() {
				rnd := rand.New(rand.NewPCG(7, 8))
				s := shape{transA: true, m: 203, n: 150, k: 600, pad: 1, alpha: 0.75, beta: 0.5}
				a, b, c := s.operands(rnd, false)
				first := c.clone()
				s.run(a, b, first)
				for off := 1; off <= 3; off++ {
					shift := func(mt matrix) matrix {
						d := make([]float32, len(mt.data)+off)
						copy(d[off:], mt.data)
						mt.data = d[off:]
						return mt
					}
					a2, b2, c2 := shift(a), shift(b), shift(c)
					s.run(a2, b2, c2)
					for idx := range c2.data {
						if math.Float32bits(c2.data[idx]) != math.Float32bits(first.data[idx]) {
							t.Fatalf("offset %d: element %d = %v, first run %v", off, idx-guard, c2.data[idx], first.data[idx])
						}
					}
				}
			})
		})
	}
}

// TestSgemmPanics checks that inconsistent arguments panic with a "sgemm:" message.
func TestSgemmPanics(t *testing.T) {
	buf := make([]float32, 100)
	cases := []struct {
		name string
		f    func()
	}{
		{"negative m", func() { Sgemm(false, false, -1, 2, 2, 1, buf, 2, buf, 2, 0, buf, 2) }},
		{"negative k", func() { Sgemm(false, false, 2, 2, -1, 1, buf, 2, buf, 2, 0, buf, 2) }},
		{"lda small", func() { Sgemm(false, false, 3, 3, 4, 1, buf, 3, buf, 3, 0, buf, 3) }},
		{"lda small transA", func() { Sgemm(true, false, 3, 3, 4, 1, buf, 2, buf, 3, 0, buf, 3) }},
		{"ldb small", func() { Sgemm(false, false, 3, 5, 4, 1, buf, 4, buf, 4, 0, buf, 5) }},
		{"ldb small transB", func() { Sgemm(false, true, 3, 5, 4, 1, buf, 4, buf, 3, 0, buf, 5) }},
		{"ldc small", func() { Sgemm(false, false, 3, 5, 4, 1, buf, 4, buf, 5, 0, buf, 4) }},
		{"short a", func() { Sgemm(false, false, 10, 2, 11, 1, buf, 11, buf, 2, 0, buf, 2) }},
		{"short b", func() { Sgemm(false, true, 2, 10, 11, 1, buf, 11, buf, 11, 0, buf, 10) }},
		{"short c", func() { Sgemm(false, false, 11, 11, 1, 1, buf, 1, buf, 11, 0, buf, 11) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				msg, _ := r.(string)
				if !strings.HasPrefix(msg, "sgemm: ") {
					t.Fatalf("recovered %v, want a panic with an \"sgemm: \" message", r)
				}
			}()
			tc.f()
		})
	}
}

// TestSgemmEmpty checks that zero dimensions are accepted with empty slices,
// and that k = 0 scales C by beta.
func TestSgemmEmpty(t *testing.T) {
	Sgemm(false, false, 0, 5, 3, 1, nil, 3, make([]float32, 15), 5, 0, nil, 5)
	Sgemm(true, true, 4, 0, 3, 1, make([]float32, 12), 4, nil, 3, 0, nil, 0)
	c := []float32{1, 2, float32(math.NaN()), 4}
	Sgemm(false, false, 2, 2, 0, 1, nil, 0, nil, 2, 0, c, 2)
	for i, v := range c {
		if v != 0 {
			t.Fatalf("k=0, beta=0: c[%d] = %v, want 0", i, v)
		}
	}
	c = []float32{1, 2, 3, 4}
	Sgemm(false, false, 2, 2, 0, 1, nil, 0, nil, 2, 2, c, 2)
	for i, v := range c {
		if v != float32(2*(i+1)) {
			t.Fatalf("k=0, beta=2: c[%d] = %v, want %v", i, v, 2*(i+1))
		}
	}
}

// withProcs runs f with maxProcs returning p.
func withProcs(p int, f func()) {
	old := maxProcs
	maxProcs = func() int { return p }
	defer func() { maxProcs = old }()
	f()
}

// TestSgemmThreads checks that splitting C into bands for several goroutines,
// by rows or by columns, gives the same bits as one goroutine.
func TestSgemmThreads(t *testing.T) {
	for _, kn := range kernels() {
		t.Run(kn.name, func(t *testing.T) {
			withKernel(kn, func() {
				rnd := rand.New(rand.NewPCG(11, 12))
				for _, s := range []shape{
					{m: 301, n: 97, k: 300, pad: 1, alpha: 1.25, beta: 0},
					{transA: true, m: 37, n: 517, k: 300, pad: 2, alpha: -1, beta: 0.5},
					{transB: true, m: 200, n: 200, k: 130, alpha: 1, beta: 1},
					{transA: true, transB: true, m: 96, n: 95, k: 600, pad: 3, alpha: 0.5, beta: 2},
					// k < the band offsets: slicing a band must respect how A and B are stored.
					{transA: true, m: 900, n: 100, k: 40, pad: 1, alpha: 1, beta: 0},
					{transB: true, m: 40, n: 2000, k: 40, pad: 2, alpha: 1, beta: 0},
					{transA: true, transB: true, m: 40, n: 2000, k: 40, alpha: 1, beta: 1},
				} {
					a, b, c := s.operands(rnd, false)
					one := c.clone()
					withProcs(1, func() { s.run(a, b, one) })
					for _, p := range []int{2, 3, 5, 64} {
						got := c.clone()
						withProcs(p, func() { s.run(a, b, got) })
						checkGuards(t, fmt.Sprintf("%v procs=%d", s, p), got, c)
						for idx := range got.data {
							if math.Float32bits(got.data[idx]) != math.Float32bits(one.data[idx]) {
								t.Fatalf("%v procs=%d: element %d = %v, one goroutine %v", s, p, idx-guard, got.data[idx], one.data[idx])
							}
						}
					}
				}
			})
		})
	}
}

// TestSgemmNoAlloc checks that steady-state calls on one goroutine do not allocate.
func TestSgemmNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	old := maxProcs
	maxProcs = func() int { return 1 }
	defer func() { maxProcs = old }()
	const n = 150
	a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	Sgemm(false, true, n, n, n, 1, a, n, b, n, 0, c, n)
	allocs := testing.AllocsPerRun(20, func() {
		Sgemm(false, true, n, n, n, 1, a, n, b, n, 0, c, n)
	})
	if allocs > 0.1 {
		t.Fatalf("Sgemm allocates %v times per call", allocs)
	}
}
