package compress

import (
	"math"
	"testing"
)

// residualOf returns a codec's error-feedback state, flattened in bucket order.
func residualOf(c Codec) []float32 {
	switch c := c.(type) {
	case *oneBitCodec:
		return c.res.e
	case *signCodec:
		return c.res.e
	case *topKCodec:
		return c.res.e
	case *lowRankCodec:
		out := make([]float32, c.total)
		for _, t := range c.tensors {
			copy(out[t.off:], t.e)
		}
		return out
	}
	return nil
}

// TestErrorFeedbackInvariant checks Σ outputs + residual = Σ inputs over several steps.
func TestErrorFeedbackInvariant(t *testing.T) {
	layout := Layout{Shapes: [][]int{{32, 24}, {50}, {3, 3}}}
	n := layout.Len()
	for _, spec := range []string{"onebit:block=64", "sign:block=100", "topk:ratio=0.05", "powersgd:rank=2", "acpsgd:rank=2", "powersgd:rank=4", "acpsgd:rank=4"} {
		c := mustNew(t, spec, Options{Layout: layout, Seed: 1, SharedSeed: 2})
		in, out := make([]float64, n), make([]float64, n)
		for s := range 6 {
			g := gradient(uint64(100+s), n)
			var got []float32
			if c.Class() == ClassLowRank {
				got = roundTrip(t, c, g, Pos{Step: uint64(s), Feedback: true})
			} else { // two regions, as a ring would encode them
				got = append(roundTrip(t, c, g[:400], Pos{Step: uint64(s), Feedback: true}),
					roundTrip(t, c, g[400:], Pos{Offset: 400, Step: uint64(s), Feedback: true})...)
			}
			for i := range g {
				in[i] += float64(g[i])
				out[i] += float64(got[i])
			}
		}
		e := residualOf(c)
		worst := 0.0
		for i := range in {
			worst = max(worst, math.Abs(out[i]+float64(e[i])-in[i]))
		}
		if worst > 1e-6 {
			t.Errorf("%s: Σ outputs + residual misses Σ inputs by %g", spec, worst)
		}
		c.Reset()
		for i, x := range residualOf(c) {
			if x != 0 {
				t.Fatalf("%s: residual %d = %g after Reset", spec, i, x)
			}
		}
	}
}
