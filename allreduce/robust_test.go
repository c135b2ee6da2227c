package allreduce

import (
	"math"
	"testing"
)

// TestCenteredClipKnownAnswer: τ = 1, v₀ = 0, g = [1,0], [0,1], [10,10];
// v after 1, 2 and 3 iterations is 0.569036, 0.758714, 0.821940 in both
// coordinates (docs/codecs.md, robust aggregation).
func TestCenteredClipKnownAnswer(t *testing.T) {
	g := [][]float32{{1, 0}, {0, 1}, {10, 10}}
	for iters, want := range map[int]float64{1: 0.569036, 2: 0.758714, 3: 0.821940} {
		v := []float32{0, 0}
		CenteredClip(v, g, 1, iters, nil)
		for i, x := range v {
			if math.Abs(float64(x)-want) > 1e-6 {
				t.Fatalf("%d iterations: v[%d] = %.6f, want %.6f", iters, i, x, want)
			}
		}
	}
}

// TestCenteredClipBoundsOneMember: one member's contribution a million
// times the others' moves the aggregate by at most τ/W per iteration from
// the honest median, where the plain mean moves by its full share.
func TestCenteredClipBoundsOneMember(t *testing.T) {
	honest := []float32{0.5, -0.25, 1}
	contribs := [][]float32{honest, honest, honest, {5e5, -5e5, 1e6}}
	v := make([]float32, 3)
	coordinateMedian(v, contribs, make([]float32, 4))
	const tau, iters = 0.1, 3
	CenteredClip(v, contribs, tau, iters, nil)
	var dist float64
	for i := range v {
		d := float64(v[i] - honest[i])
		dist += d * d
	}
	if bound := tau / 4 * iters; math.Sqrt(dist) > bound+1e-6 {
		t.Fatalf("aggregate %v is %.4f from the honest value, bound τ·L/W = %.4f", v, math.Sqrt(dist), bound)
	}
}

func TestCoordinateMedian(t *testing.T) {
	v := make([]float32, 2)
	coordinateMedian(v, [][]float32{{3, 1}, {1, 4}, {2, 9}}, make([]float32, 3))
	if v[0] != 2 || v[1] != 4 {
		t.Fatalf("odd count: %v, want [2 4]", v)
	}
	coordinateMedian(v, [][]float32{{3, 1}, {1, 4}, {2, 9}, {10, 0}}, make([]float32, 4))
	if v[0] != 2.5 || v[1] != 2.5 {
		t.Fatalf("even count: %v, want [2.5 2.5]", v)
	}
}
