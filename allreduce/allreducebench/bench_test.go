package allreducebench

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"testing/synctest"
)

const mbit = 1e6 / 8

func TestResultJSON(t *testing.T) {
	r := NewResult(64<<20, "none", "ring", 4, 2)
	b, _ := json.Marshal(r)
	for _, k := range []string{`"size_bytes":67108864`, `"codec":"none"`, `"schedule":"ring"`, `"peers":4`, `"median_s":2`, `"algbw_gbps"`, `"busbw_gbps"`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("%s lacks %s", b, k)
		}
	}
	if r.BusBWGbps != r.AlgBWGbps*1.5 {
		t.Errorf("busbw %v, algbw %v", r.BusBWGbps, r.AlgBWGbps)
	}
	if s := r.String(); !strings.Contains(s, "64MiB") {
		t.Errorf("%q", s)
	}
}

// TestModel runs small cases under synctest (network model only) and checks
// the schedule works end to end; it asserts nothing about timings beyond sanity.
func TestModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, err := Run(context.Background(), Options{Peers: 4, SizeBytes: 4 << 20, Codec: "none", Rounds: 2, Bandwidth: []float64{1000 * mbit}})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(r)
		if r.BusBWGbps < 0.9 || r.BusBWGbps > 1.01 {
			t.Errorf("fp32 busbw %v Gbit/s on 1 Gbit/s links", r.BusBWGbps)
		}
	})
}

// TestModelLinkCodecs: per-link codecs carry the slow peer's ring links at
// half the bytes (fp32 → fp16), so the ring finishes in about half the
// (virtual) time; off and other schedules leave the codec alone.
func TestModelLinkCodecs(t *testing.T) {
	mixed := []float64{100 * mbit, 1000 * mbit, 1000 * mbit, 1000 * mbit}
	run := func(o Options) Result { return runModel(t, o) }
	o := Options{Peers: 4, SizeBytes: 2 << 20, Rounds: 1, Bandwidth: mixed, Schedule: "ring"}
	off := run(o)
	o.LinkCodecs = "auto"
	auto := run(o)
	if off.Schedule != "ring" || auto.Schedule != "ring+links" {
		t.Fatalf("schedules %q and %q, want ring and ring+links", off.Schedule, auto.Schedule)
	}
	if r := off.MedianS / auto.MedianS; r < 1.8 || r > 2.2 {
		t.Errorf("per-link fp16 on the slow links: %.2f× the plain ring, want about 2×", r)
	}
	o.Schedule = "direct"
	if r := run(o); r.Schedule != "direct" {
		t.Errorf("direct schedule with link codecs: %q", r.Schedule)
	}
	o.Schedule, o.Codec = "ring", "onebit"
	if _, err := Run(context.Background(), o); err == nil {
		t.Error("per-link codecs of onebit: no error")
	}
}

// TestTargets prints the target figures under the network model
// (P2PTRAIN_BENCH=1; 64 MiB buffers, slow).
func TestTargets(t *testing.T) {
	if os.Getenv("P2PTRAIN_BENCH") == "" {
		t.Skip("set P2PTRAIN_BENCH=1")
	}
	run := func(o Options) Result { return runModel(t, o) }
	size := 64 << 20
	base := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: []float64{1000 * mbit}})
	t.Logf("fp32 1Gbit: busbw/link = %.3f", base.BusBWGbps)
	slow := []float64{100 * mbit}
	fp := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: slow})
	for _, c := range []string{"int8", "sint8", "dyn8", "onebit", "sign", "qsgd:bits=4"} {
		r := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: slow, Codec: c})
		t.Logf("100Mbit %s: speedup %.2fx over fp32", c, fp.MedianS/r.MedianS)
	}
	mixed := []float64{100 * mbit, 1000 * mbit, 1000 * mbit, 1000 * mbit}
	ring := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: mixed, Schedule: "ring"})
	prop := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: mixed, Schedule: "auto"})
	t.Logf("1 slow + 3 fast: proportional %.2fx over ring", ring.MedianS/prop.MedianS)
}

// TestTargetsRealTime is TestTargets on the real clock: figures include the
// encode/decode CPU time of all peers sharing this machine
// (P2PTRAIN_BENCH_REAL=1; takes minutes).
func TestTargetsRealTime(t *testing.T) {
	if os.Getenv("P2PTRAIN_BENCH_REAL") == "" {
		t.Skip("set P2PTRAIN_BENCH_REAL=1")
	}
	run := func(o Options) Result {
		r, err := Run(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		t.Log(r)
		return r
	}
	size := 64 << 20
	slow := []float64{100 * mbit}
	fp := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: slow})
	for _, c := range []string{"int8", "sint8", "dyn8", "onebit", "sign", "qsgd:bits=4"} {
		r := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: slow, Codec: c})
		t.Logf("100Mbit %s: speedup %.2fx over fp32", c, fp.MedianS/r.MedianS)
	}
	mixed := []float64{100 * mbit, 1000 * mbit, 1000 * mbit, 1000 * mbit}
	ring := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: mixed, Schedule: "ring"})
	prop := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: mixed, Schedule: "auto"})
	t.Logf("1 slow + 3 fast: proportional %.2fx over ring", ring.MedianS/prop.MedianS)
}

// TestBucketSizes prints fp32 all-reduce times of 64 MiB split into
// buckets of different sizes on 100 Mbit/s links with 5 ms latency, under
// the network model (P2PTRAIN_BENCH=1).
func TestBucketSizes(t *testing.T) {
	if os.Getenv("P2PTRAIN_BENCH") == "" {
		t.Skip("set P2PTRAIN_BENCH=1")
	}
	for _, nb := range []int{1, 3, 16, 64} {
		synctest.Test(t, func(t *testing.T) {
			r, err := Run(context.Background(), Options{Peers: 4, SizeBytes: 64 << 20, Rounds: 1, Buckets: nb,
				Bandwidth: []float64{100 * mbit}, Latency: 5e6})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d buckets of %s: %s", nb, FormatBytes((64<<20)/nb), r)
		})
	}
}

// runModel runs the benchmark o under the network model (virtual time) and
// logs its result.
func runModel(t *testing.T, o Options) Result {
	t.Helper()
	var r Result
	synctest.Test(t, func(t *testing.T) {
		var err error
		if r, err = Run(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	})
	t.Log(r)
	return r
}
