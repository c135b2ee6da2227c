package compress

import (
	"math"
	"testing"
)

// acpRef is a float64 transcription of the ACP-SGD formulas in docs/codecs.md
// for one n×m matrix and W peers: the codec is checked against it step by step.
type acpRef struct {
	n, m, r int
	q, p    []float64   // the last all-reduced sums ΣQ (m×r) and ΣP (n×r)
	e       [][]float64 // each peer's error (n×m)
	qStep   bool
}

// refOrth is the spec's modified Gram–Schmidt: each column divided by ‖col‖ + 1e-8.
func refOrth(a []float64, n, r int) []float64 {
	a = append([]float64(nil), a...)
	for j := range r {
		for c := range j {
			var dot float64
			for i := range n {
				dot += a[i*r+c] * a[i*r+j]
			}
			for i := range n {
				a[i*r+j] -= dot * a[i*r+c]
			}
		}
		var ss float64
		for i := range n {
			ss += a[i*r+j] * a[i*r+j]
		}
		inv := 1 / (math.Sqrt(ss) + 1e-8)
		for i := range n {
			a[i*r+j] *= inv
		}
	}
	return a
}

// step runs one spec step on the peers' gradients and returns the averaged gradient.
func (s *acpRef) step(grads [][]float32) []float64 {
	n, m, r, w := s.n, s.m, s.r, len(grads)
	sum := make([]float64, max(n, m)*r)
	var hat []float64
	if s.qStep {
		hat = refOrth(s.p, n, r) // P̂ = orth(ΣP)
	} else {
		hat = refOrth(s.q, m, r) // Q̂ = orth(ΣQ)
	}
	for i, g := range grads {
		mp := make([]float64, n*m) // M + E
		for k := range mp {
			mp[k] = float64(g[k]) + s.e[i][k]
		}
		// P-step: P = (M + E)Q̂, E = M + E − PQ̂ᵀ, P's rows indexed by M's rows.
		// Q-step: Q = (M + E)ᵀP̂, E = M + E − P̂Qᵀ, Q's rows indexed by M's columns.
		rows, inner := n, m
		at := func(o, k int) int { return o*m + k } // element of M for factor row o, inner index k
		if s.qStep {
			rows, inner = m, n
			at = func(o, k int) int { return k*m + o }
		}
		f := make([]float64, rows*r)
		for o := range rows {
			for j := range r {
				for k := range inner {
					f[o*r+j] += mp[at(o, k)] * hat[k*r+j]
				}
			}
		}
		for o := range rows {
			for k := range inner {
				for j := range r {
					mp[at(o, k)] -= f[o*r+j] * hat[k*r+j]
				}
			}
		}
		for x := range f {
			sum[x] += f[x]
		}
		s.e[i] = mp
	}
	out := make([]float64, n*m) // (sum)·(other factor)ᵀ / W
	for a := range n {
		for k := range m {
			var x float64
			for j := range r {
				if s.qStep {
					x += hat[a*r+j] * sum[k*r+j]
				} else {
					x += sum[a*r+j] * hat[k*r+j]
				}
			}
			out[a*m+k] = x / float64(w)
		}
	}
	if s.qStep {
		s.q = sum[:m*r]
	} else {
		s.p = sum[:n*r]
	}
	s.qStep = !s.qStep
	return out
}

// closeTo reports whether got is within tol·max|want| of want everywhere.
func closeTo(got []float32, want []float64, tol float64) bool {
	var scale float64
	for _, x := range want {
		scale = max(scale, math.Abs(x))
	}
	for i, x := range want {
		if math.Abs(float64(got[i])-x) > tol*scale {
			return false
		}
	}
	return true
}

// TestACPSGDMatchesSpec: three peers, rank 4, seeded Q₀, eight alternating
// steps: every peer's output and error follow the float64 transcription of the
// spec (error against the local factor, the other factor the orthonormalised
// last sum, gradient = sum·otherᵀ/W), and Σ_t W·grad_t + Σ_i E_i = Σ_t Σ_i G.
func TestACPSGDMatchesSpec(t *testing.T) {
	const w, r, n, m = 3, 4, 24, 18
	opts := Options{Layout: Layout{Shapes: [][]int{{n, m}, {5}}}, SharedSeed: 99}
	cs := make([]*lowRankCodec, w)
	for i := range cs {
		cs[i] = newLowRank("acpsgd:rank=4", r, opts, true, false)
	}
	if !cs[0].tensors[0].matrix {
		t.Fatal("the matrix is not compressed")
	}
	ref := &acpRef{n: n, m: m, r: r, p: make([]float64, n*r), e: make([][]float64, w)}
	for _, x := range cs[0].tensors[0].q {
		ref.q = append(ref.q, float64(x))
	}
	for i := range ref.e {
		ref.e[i] = make([]float64, n*m)
	}
	total := make([]float64, n*m) // Σ_t Σ_i G − Σ_t W·grad_t
	for s := range 8 {
		grads := make([][]float32, w)
		mats := make([][]float32, w)
		for i := range grads {
			grads[i] = gradient(uint64(100*s+i), n*m+5)
			mats[i] = grads[i][:n*m]
			for k, x := range mats[i] {
				total[k] += float64(x)
			}
		}
		outs := step(t, cs, grads)
		want := ref.step(mats)
		for i, o := range outs {
			if !near(o, outs[0], 0) {
				t.Fatalf("step %d: peer %d disagrees with peer 0", s, i)
			}
			if !closeTo(o[:n*m], want, 1e-5) {
				t.Fatalf("step %d: peer %d gradient differs from the spec", s, i)
			}
			if !closeTo(cs[i].tensors[0].e, ref.e[i], 1e-5) {
				t.Fatalf("step %d: peer %d error differs from the spec", s, i)
			}
		}
		for k := range n * m {
			total[k] -= w * float64(outs[0][k])
		}
	}
	for k := range total {
		var e float64
		for i := range cs {
			e += float64(cs[i].tensors[0].e[k])
		}
		if math.Abs(total[k]-e) > 1e-4 {
			t.Fatalf("element %d: Σ G − Σ W·grad = %g, Σ E = %g", k, total[k], e)
		}
	}
}
