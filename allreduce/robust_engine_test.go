package allreduce_test

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"testing/synctest"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
)

// robustRound all-reduces one bucket of data (one row per peer) with codec
// spec and cfg, and returns each peer's output and error.
func robustRound(t *testing.T, spec string, cfg allreduce.Config, data [][]float32) ([][]float32, []error) {
	t.Helper()
	w, n := len(data), len(data[0])
	c := newCluster(t, w, 1, cfg, memOpts())
	defer c.close()
	in := make([][][]float32, w)
	codecs := make([][]compress.Codec, w)
	for i := range data {
		cd, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(n), Seed: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		in[i], codecs[i] = [][]float32{data[i]}, []compress.Codec{cd}
	}
	outs, errs := c.round(0, in, codecs)
	res := make([][]float32, w)
	for i := range outs {
		res[i] = outs[i][0]
	}
	return res, errs
}

// TestRobustAggregationBoundsAHugeContribution: one member of five sends a
// gradient a million times the others'. The plain mean follows it; centered
// clipping keeps the result near the honest members' mean, on every peer
// bit for bit, with a linear, a quantized and an error-feedback codec.
func TestRobustAggregationBoundsAHugeContribution(t *testing.T) {
	const w, n = 5, 5003
	for _, spec := range []string{"none", "int8", "onebit"} {
		t.Run(spec, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// The members agree on a signal up to 10% noise, as gradients
				// of one model on different batches do.
				d := randData(11, w, n)
				signal := randData(12, 1, n)[0]
				for i := range d {
					for j := range d[i] {
						d[i][j] = signal[j] + 0.1*d[i][j]
					}
				}
				honest := average(d[:w-1])
				for i := range d[w-1] {
					d[w-1][i] *= 1e6
				}
				robust := allreduce.Config{ChunkBytes: 4096, Robust: &allreduce.Robust{Tau: 1, Iters: 3}}
				plainOut, errs := robustRound(t, spec, allreduce.Config{ChunkBytes: 4096}, clone(d))
				mustSucceed(t, errs)
				out, errs := robustRound(t, spec, robust, clone(d))
				mustSucceed(t, errs)
				for i := 1; i < w; i++ {
					if !bitsEqual(out[0], out[i]) {
						t.Fatalf("peer %d's robust aggregate differs from peer 0's", i)
					}
				}
				plainErr, robustErr := distance(plainOut[0], honest), distance(out[0], honest)
				if !(robustErr < plainErr/1000) {
					t.Fatalf("distance to the honest mean: plain %.3g, robust %.3g; want robust < plain/1000", plainErr, robustErr)
				}
				// onebit's own one-step error is of the order of the signal.
				if norm := distance(make([]float32, n), honest); spec != "onebit" && !(robustErr < 0.15*norm) {
					t.Fatalf("robust aggregate is %.3g from the honest mean, more than 15%% of its norm %.3g", robustErr, norm)
				}
				t.Logf("%s: distance to the honest mean: plain %.3g, centered clipping %.3g", spec, plainErr, robustErr)
			})
		})
	}
}

// TestNonFiniteContributionNamesItsSender: a member whose contribution
// holds NaN fails the round on every peer with an error that names it (an
// honest peer never forwards a non-finite partial sum), in the ring and
// the direct schedule and with robust aggregation.
func TestNonFiniteContributionNamesItsSender(t *testing.T) {
	const w, n, bad = 4, 3001, 2
	for _, cfg := range []allreduce.Config{
		{ChunkBytes: 4096, Schedule: allreduce.ScheduleRing},
		{ChunkBytes: 4096, Schedule: allreduce.ScheduleDirect},
		{ChunkBytes: 4096, Robust: &allreduce.Robust{Tau: 1, Iters: 2}},
	} {
		t.Run(fmt.Sprintf("%s/robust=%v", cfg.Schedule, cfg.Robust != nil), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := randData(5, w, n)
				d[bad][1234] = float32(math.NaN())
				_, errs := robustRound(t, "none", cfg, d)
				for i, err := range errs {
					var pe *allreduce.PeerError
					if !errors.As(err, &pe) || pe.Peer != peerIDs(w)[bad] || !errors.Is(err, allreduce.ErrBadFrame) {
						t.Fatalf("peer %d: %v; want a bad-frame error naming peer %d", i, err, bad)
					}
				}
			})
		})
	}
}

func mustSucceed(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
	}
}

func clone(d [][]float32) [][]float32 {
	out := make([][]float32, len(d))
	for i := range d {
		out[i] = append([]float32(nil), d[i]...)
	}
	return out
}

func distance(a, b []float32) float64 {
	var s float64
	for i := range a {
		x := float64(a[i] - b[i])
		s += x * x
	}
	return math.Sqrt(s)
}
