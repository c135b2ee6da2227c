package allreduce_test

import (
	"errors"
	"math"
	"testing"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
)

// TestRingFramesCountsTheEngine: RingFrames is the number of frames a
// peer of a real ring sends (memtransport counts them), for fp32 and for
// codecs whose chunks grow with their compression, over bucket sizes that
// make one chunk per segment, the pipeline's 8, and chunks at the
// configured maximum.
func TestRingFramesCountsTheEngine(t *testing.T) {
	for _, spec := range []string{"none", "dyn8", "qsgd:bits=4"} {
		for _, w := range []int{2, 3, 4} {
			for _, n := range []int{1000, 70_000, 1_500_000} {
				codec := func(n int) compress.Codec {
					c, err := compress.New(spec, compress.Options{Layout: layoutFor(spec, n), Seed: 1, SharedSeed: 42})
					if err != nil {
						t.Fatal(err)
					}
					return c
				}
				c := newCluster(t, w, 2, allreduce.Config{Schedule: allreduce.ScheduleRing}, memOpts())
				data := make([][][]float32, w)
				codecs := make([][]compress.Codec, w)
				for i, d := range randData(uint64(n), w, n) {
					data[i], codecs[i] = [][]float32{d}, []compress.Codec{codec(n)}
				}
				if _, errs := c.round(0, data, codecs); errors.Join(errs...) != nil {
					t.Fatalf("%s W=%d n=%d: %v", spec, w, n, errors.Join(errs...))
				}
				total := 0
				for _, p := range c.peers {
					total += c.net.Sent(p)
				}
				c.close()
				want := allreduce.RingFrames(n, w, codec(n), 0)
				if got := float64(total) / float64(w); math.Abs(got-want) > 1e-9 {
					t.Errorf("%s W=%d n=%d: peers sent %.3f frames on average, RingFrames says %.3f", spec, w, n, got, want)
				}
			}
		}
	}
}
