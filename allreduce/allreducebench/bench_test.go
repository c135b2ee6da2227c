package allreducebench

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"
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

// TestWithCPU: the CPU time over the buffer bytes of every round, in s/GB;
// nothing measured leaves the field out of the JSON.
func TestWithCPU(t *testing.T) {
	r := NewResult(250e6, "none", "ring", 4, 1).WithCPU(3*time.Second, 4)
	if r.CPUSPerGB != 3 {
		t.Errorf("3 s over 4 rounds of 250 MB: %v s/GB, want 3", r.CPUSPerGB)
	}
	if !strings.Contains(r.String(), "cpu 3.00 s/GB") {
		t.Errorf("%q lacks the CPU figure", r.String())
	}
	b, _ := json.Marshal(r.WithCPU(0, 4))
	if strings.Contains(string(b), "cpu_s_per_gb") {
		t.Errorf("unmeasured CPU in %s", b)
	}
}

func TestWithMachineCPU(t *testing.T) {
	r := NewResult(250e6, "none", "ring", 4, 1).WithCPU(3*time.Second, 4).WithMachineCPU(8*time.Second, 4)
	if r.MachineCPUSPerGB != 8 || r.CPUSPerGB != 3 {
		t.Errorf("8 s of the machine over 4 rounds of 250 MB: %v s/GB (process %v), want 8 (3)", r.MachineCPUSPerGB, r.CPUSPerGB)
	}
	b, _ := json.Marshal(r)
	if !strings.Contains(string(b), `"machine_cpu_s_per_gb":8`) {
		t.Errorf("machine CPU missing from %s", b)
	}
	b, _ = json.Marshal(r.WithMachineCPU(0, 4))
	if strings.Contains(string(b), "machine_cpu_s_per_gb") {
		t.Errorf("unmeasured machine CPU in %s", b)
	}
}

// TestModelFP32ReachesLinkRate: under the network model (virtual time) a
// 4-peer fp32 ring on 1 Gbit/s links reaches 0.9 to 1.01 of the link rate.
func TestModelFP32ReachesLinkRate(t *testing.T) {
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

// BenchmarkTargets runs 4 peers over shaped in-memory links on the real
// clock (so the figures include every peer's encode/decode CPU time on this
// machine) with 64 MiB buffers and reports, for each codec at 100 Mbit/s,
// its speed-up over fp32, and with one 100 Mbit/s peer among 1 Gbit/s ones,
// the automatic schedule's speed-up over the plain ring. Slow (minutes):
//
//	go test -run '^$' -bench Targets -benchtime 1x ./allreduce/allreducebench
func BenchmarkTargets(b *testing.B) {
	run := func(o Options) Result {
		r, err := Run(context.Background(), o)
		if err != nil {
			b.Fatal(err)
		}
		b.Log(r)
		return r
	}
	const size = 64 << 20
	slow := []float64{100 * mbit}
	mixed := []float64{100 * mbit, 1000 * mbit, 1000 * mbit, 1000 * mbit}
	for b.Loop() {
		fp := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: slow})
		for _, c := range []string{"int8", "sint8", "dyn8", "onebit", "sign", "qsgd:bits=4"} {
			r := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: slow, Codec: c})
			b.ReportMetric(fp.MedianS/r.MedianS, "x_"+c+"_over_fp32")
		}
		ring := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: mixed, Schedule: "ring"})
		auto := run(Options{Peers: 4, SizeBytes: size, Rounds: 1, Bandwidth: mixed, Schedule: "auto"})
		b.ReportMetric(ring.MedianS/auto.MedianS, "x_auto_over_ring_1slow")
	}
}

// runModel runs the benchmark o under the network model (virtual time) and
// logs its result.
func runModel(t *testing.T, o Options) Result {
	t.Helper()
	r := inBubble(t, func(ctx context.Context) (Result, error) { return Run(ctx, o) })
	t.Log(r)
	return r
}

// TestWireBytesAndEfficiency: a peer of a 4-peer fp32 ring sends
// 2(W−1)/W of the buffer (plus frame headers), the ideal is those bytes at
// the link rate, and under the network model (virtual time) the ring runs
// at 0.9 to 1.01 of it; sint8 sends about a quarter of that.
func TestWireBytesAndEfficiency(t *testing.T) {
	const size = 4 << 20
	for _, tc := range []struct {
		codec string
		ratio float64 // wire bytes / fp32 bytes
	}{{"none", 1}, {"sint8", 0.25}} {
		r := runModel(t, Options{Peers: 4, SizeBytes: size, Codec: tc.codec, Rounds: 2, Bandwidth: []float64{1000 * mbit}, Schedule: "ring"})
		want := 1.5 * size * tc.ratio
		if r.WireBytes < want || r.WireBytes > 1.03*want {
			t.Errorf("%s: %.0f bytes on the wire per peer, want %.0f plus headers", tc.codec, r.WireBytes, want)
		}
		if ideal := r.WireBytes / (1000 * mbit); r.IdealS < 0.999*ideal || r.IdealS > 1.001*ideal {
			t.Errorf("%s: ideal %.4fs, want the wire bytes at the link rate, %.4fs", tc.codec, r.IdealS, ideal)
		}
		if r.Efficiency != r.IdealS/r.MedianS || (tc.codec == "none" && (r.Efficiency < 0.9 || r.Efficiency > 1.01)) {
			t.Errorf("%s: efficiency %.3f (ideal %.4fs, median %.4fs)", tc.codec, r.Efficiency, r.IdealS, r.MedianS)
		}
		t.Log(r)
	}
	if got := IdealSeconds([]float64{10, 20}, []float64{30, 5}, []float64{10, 0}); got != 0 {
		t.Errorf("ideal with an unknown rate = %v, want 0", got)
	}
	if got := IdealSeconds([]float64{10, 20}, []float64{30, 5}, []float64{10, 10}); got != 3 {
		t.Errorf("ideal = %v, want 3 (30 bytes in at 10 bytes/s)", got)
	}
}
