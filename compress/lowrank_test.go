package compress

import (
	"math"
	"testing"
)

// newTestLowRank builds a rank-r codec that compresses even tiny matrices, with Q₀ = ones.
func newTestLowRank(t *testing.T, acp bool, r int, shapes ...[]int) *lowRankCodec {
	t.Helper()
	c := newLowRank("test", r, Options{Layout: Layout{Shapes: shapes}}, acp, true)
	for i := range c.tensors {
		for k := range c.tensors[i].q {
			c.tensors[i].q[k] = 1
		}
	}
	return c
}

// step runs one LowRank step with peers codecs on their gradients and returns their outputs.
func step(t *testing.T, cs []*lowRankCodec, grads [][]float32) [][]float32 {
	t.Helper()
	outs := make([][]float32, len(cs))
	for round := range cs[0].Rounds() {
		var sum []float32
		for i, c := range cs {
			var g []float32
			if round == 0 {
				g = grads[i]
			}
			f, err := c.Factor(round, 0, g)
			if err != nil {
				t.Fatal(err)
			}
			if sum == nil {
				sum = make([]float32, len(f))
			}
			for k, x := range f {
				sum[k] += x
			}
		}
		for i, c := range cs {
			if round == c.Rounds()-1 {
				outs[i] = make([]float32, c.total)
			}
			if err := c.Absorb(round, sum, len(cs), outs[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	return outs
}

const third = 1.0 / 3

// TestPowerSGDKnownAnswer: W = 1, r = 1, M = [[1,0],[0,2],[1,1]], Q₀ = 1.
func TestPowerSGDKnownAnswer(t *testing.T) {
	c := newTestLowRank(t, false, 1, []int{3, 2})
	out := step(t, []*lowRankCodec{c}, [][]float32{{1, 0, 0, 2, 1, 1}})[0]
	tt := &c.tensors[0]
	if !near(tt.p, []float32{third, 2 * third, 2 * third}, 1e-6) || !near(tt.q, []float32{1, 2}, 1e-6) {
		t.Errorf("P̂ = %v, Q = %v", tt.p, tt.q)
	}
	if !near(out, []float32{third, 2 * third, 2 * third, 4 * third, 2 * third, 4 * third}, 1e-6) {
		t.Errorf("approximation = %v", out)
	}
	if !near(tt.e, []float32{2 * third, -2 * third, -2 * third, 2 * third, third, -third}, 1e-6) {
		t.Errorf("error = %v", tt.e)
	}
}

// TestPowerSGDLinearity: W = 2 with M₂ = [[0,1],[1,0],[−1,1]]: ΣP = [2,3,2] and the averaged approximation.
func TestPowerSGDLinearity(t *testing.T) {
	cs := []*lowRankCodec{newTestLowRank(t, false, 1, []int{3, 2}), newTestLowRank(t, false, 1, []int{3, 2})}
	outs := step(t, cs, [][]float32{{1, 0, 0, 2, 1, 1}, {0, 1, 1, 0, -1, 1}})
	s17 := float32(math.Sqrt(17))
	if !near(cs[0].tensors[0].p, []float32{2 / s17, 3 / s17, 2 / s17}, 1e-6) {
		t.Errorf("P̂ = %v", cs[0].tensors[0].p)
	}
	want := []float32{0.294118, 0.705882, 0.441176, 1.058824, 0.294118, 0.705882}
	for i, o := range outs {
		if !near(o, want, 1e-6) {
			t.Errorf("peer %d output %v, want %v", i, o, want)
		}
	}
	if !near(outs[0], outs[1], 0) {
		t.Errorf("peers disagree: %v vs %v", outs[0], outs[1])
	}
}

// TestACPSGDKnownAnswer: two steps with G₁, G₂ and the invariant grad₀ + grad₁ + E = G₁ + G₂.
func TestACPSGDKnownAnswer(t *testing.T) {
	c := newTestLowRank(t, true, 1, []int{3, 2})
	g1 := []float32{1, 0, 0, 2, 1, 1}
	g2 := []float32{2, 1, 0, 1, 1, 0}
	out0 := step(t, []*lowRankCodec{c}, [][]float32{g1})[0]
	if !near(out0, []float32{0.5, 0.5, 1, 1, 1, 1}, 1e-6) || !near(c.tensors[0].e, []float32{0.5, -0.5, -1, 1, 0, 0}, 1e-6) {
		t.Errorf("step 0: gradient %v, E %v", out0, c.tensors[0].e)
	}
	out1 := step(t, []*lowRankCodec{c}, [][]float32{g2})[0]
	if !near(c.tensors[0].hat[:3], []float32{third, 2 * third, 2 * third}, 1e-6) || !near(c.tensors[0].q, []float32{5.0 / 6, 1.5}, 1e-6) {
		t.Errorf("step 1: P̂ %v, Q %v", c.tensors[0].hat[:3], c.tensors[0].q)
	}
	if !near(out1, []float32{5.0 / 18, 0.5, 5.0 / 9, 1, 5.0 / 9, 1}, 1e-6) {
		t.Errorf("step 1: gradient %v", out1)
	}
	for i := range g1 {
		if d := out0[i] + out1[i] + c.tensors[0].e[i] - g1[i] - g2[i]; math.Abs(float64(d)) > 1e-6 {
			t.Errorf("invariant broken at %d by %g", i, d)
		}
	}
}

// TestACPSGDLinearity: with W = 2 the output is the mean of the single-peer outputs, identical on both peers.
func TestACPSGDLinearity(t *testing.T) {
	shape := []int{6, 5}
	grads := [][][]float32{{gradient(10, 30), gradient(11, 30)}, {gradient(12, 30), gradient(13, 30)}}
	pair := []*lowRankCodec{newTestLowRank(t, true, 2, shape), newTestLowRank(t, true, 2, shape)}
	solo := []*lowRankCodec{newTestLowRank(t, true, 2, shape), newTestLowRank(t, true, 2, shape)}
	for s := range grads { // a P-step, then a Q-step
		outs := step(t, pair, grads[s])
		if !near(outs[0], outs[1], 0) {
			t.Fatalf("step %d: peers disagree", s)
		}
		a := step(t, solo[:1], grads[s][:1])[0]
		b := step(t, solo[1:], grads[s][1:])[0]
		if s == 1 {
			break // solo runs' shared state now differs from the pair's
		}
		for i := range a {
			if d := outs[0][i] - (a[i]+b[i])/2; math.Abs(float64(d)) > 1e-7 {
				t.Errorf("step %d value %d: %g, want %g", s, i, outs[0][i], (a[i]+b[i])/2)
			}
		}
	}
}

// TestLowRankRetry: a step aborted after its factors can be retried from round 0.
func TestLowRankRetry(t *testing.T) {
	for _, acp := range []bool{false, true} {
		a, b := newTestLowRank(t, acp, 2, []int{8, 6}, []int{5}), newTestLowRank(t, acp, 2, []int{8, 6}, []int{5})
		g := gradient(5, 53)
		if _, err := a.Factor(0, 0, g); err != nil { // aborted attempt
			t.Fatal(err)
		}
		oa := step(t, []*lowRankCodec{a}, [][]float32{g})[0]
		ob := step(t, []*lowRankCodec{b}, [][]float32{g})[0]
		if !near(oa, ob, 0) || !near(a.tensors[0].e, b.tensors[0].e, 0) {
			t.Errorf("acp=%v: a retried step differs", acp)
		}
		if err := a.Absorb(0, make([]float32, 3), 1, nil); err == nil {
			t.Errorf("acp=%v: Absorb out of order accepted", acp)
		}
	}
}

// TestKernels checks the blocked rank-4 kernels (and the generic ones) against
// naive float64 loops, on odd row counts so both paths run.
func TestKernels(t *testing.T) {
	for _, r := range []int{4, 3} {
		n, m := 7, 9
		g, e := gradient(20, n*m), gradient(21, n*m)
		q, a := gradient(22, m*r), gradient(23, n*r)
		p, mp, qt := make([]float32, n*r), make([]float32, n*m), make([]float32, m*r)
		prepMul(p, mp, g, e, q, n, m, r)
		mulT(qt, mp, a, n, m, r)
		out := make([]float32, n*m)
		outer(out, a, q, n, m, r, 0.5)
		sub := append([]float32(nil), mp...)
		subOuter(sub, a, q, n, m, r)
		dec := make([]float32, n*m)
		outerBytes(dec, f32Bytes(a), f32Bytes(q), n, m, r, false)
		for i := range n {
			for k := range m {
				x := float64(g[i*m+k]) + float64(e[i*m+k])
				var ab float64
				for j := range r {
					ab += float64(a[i*r+j]) * float64(q[k*r+j])
				}
				if !near(mp[i*m+k:i*m+k+1], []float32{float32(x)}, 0) ||
					!near(out[i*m+k:i*m+k+1], []float32{float32(ab / 2)}, 1e-9) ||
					!near(dec[i*m+k:i*m+k+1], []float32{float32(ab)}, 1e-9) ||
					!near(sub[i*m+k:i*m+k+1], []float32{float32(x - ab)}, 1e-9) {
					t.Fatalf("r=%d: element (%d,%d) wrong", r, i, k)
				}
			}
			for j := range r {
				var s float64
				for k := range m {
					s += float64(mp[i*m+k]) * float64(q[k*r+j])
				}
				if !near(p[i*r+j:i*r+j+1], []float32{float32(s)}, 1e-9) {
					t.Fatalf("r=%d: P(%d,%d) = %g, want %g", r, i, j, p[i*r+j], s)
				}
			}
		}
		for k := range m {
			for j := range r {
				var s float64
				for i := range n {
					s += float64(mp[i*m+k]) * float64(a[i*r+j])
				}
				if !near(qt[k*r+j:k*r+j+1], []float32{float32(s)}, 1e-9) {
					t.Fatalf("r=%d: Q(%d,%d) = %g, want %g", r, k, j, qt[k*r+j], s)
				}
			}
		}
	}
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		putF32(b[4*i:], x)
	}
	return b
}
