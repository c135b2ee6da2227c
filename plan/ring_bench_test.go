package plan

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// siteMatrix is a measured-looking matrix of n peers: racks of 8 with fast
// links inside a rack and slower, noisy ones between racks, quantised to
// powers of planStep as the planner sees them.
func siteMatrix(n int, seed uint64) Matrix {
	r := rand.New(rand.NewPCG(seed, 7))
	m := make(Matrix, n)
	for i := range m {
		m[i] = make([]float64, n)
		for j := range m[i] {
			if i == j {
				continue
			}
			v := 1e9 / 8 * (0.6 + 0.4*r.Float64())
			if i/8 != j/8 {
				v = 100e6 / 8 * (0.3 + 0.7*r.Float64())
			}
			m[i][j] = math.Pow(planStep, math.Round(math.Log(v)/math.Log(planStep)))
		}
	}
	return m
}

// BenchmarkRingOrder is the ring planner's time per proposal at 16 to 256
// peers (issue: ≤ 50 ms at 256).
func BenchmarkRingOrder(b *testing.B) {
	for _, n := range []int{16, 64, 128, 256} {
		m := siteMatrix(n, 1)
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			var o []int
			for b.Loop() {
				o = RingOrder(m)
			}
			b.ReportMetric(Bottleneck(m, o)*8/1e6, "bottleneck_Mbit/s")
		})
	}
}

// BenchmarkChoose is the whole layout choice (ring order, shares, per-link
// codecs' predictions) at 16 to 256 peers.
func BenchmarkChoose(b *testing.B) {
	for _, n := range []int{16, 64, 128, 256} {
		m := siteMatrix(n, 1)
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			for b.Loop() {
				Choose(m, 64<<20)
			}
		})
	}
}

// BenchmarkPipelineOrder is the pipeline layout of 4 stages at 16 to 256
// peers: rotations and swaps up to pipeSearchMax peers, rotations only
// above (go test -run '^$' -bench PipelineOrder ./plan).
func BenchmarkPipelineOrder(b *testing.B) {
	for _, n := range []int{16, 64, 128, 256} {
		m := siteMatrix(n, 1)
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			var o []int
			for b.Loop() {
				o = PipelineOrder(m, 4, nil)
			}
			hops, _ := LayoutRates(m, o, 4)
			b.ReportMetric(slices.Min(hops)*8/1e6, "slowest_hop_Mbit/s")
		})
	}
}
