package node

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/p2ptrain/p2ptrain/protocol/probe"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

// feedRun gives m a short run's timeline: two steps, an evaluation of a
// classifier, and events (two failed attempts, a resync, three epochs, an
// exclusion, and two that have no counter).
func feedRun(m telemetry.Sink) {
	ptr := func(v float64) *float64 { return &v }
	for _, r := range []telemetry.Record{
		{Kind: telemetry.KindEvent, Event: telemetry.EventEpoch},
		{Kind: telemetry.KindStep, Step: 1, Steps: 10, Loss: 2.5, SamplesPerS: 400, BytesSent: 1000, Codec: "sint8",
			StepS: 0.2, ComputeS: 0.15, AllreduceS: 0.05, WaitS: 3},
		{Kind: telemetry.KindEvent, Event: telemetry.EventStepFailed},
		{Kind: telemetry.KindEvent, Event: telemetry.EventStepFailed},
		{Kind: telemetry.KindEvent, Event: telemetry.EventExcluded},
		{Kind: telemetry.KindEvent, Event: telemetry.EventEpoch},
		{Kind: telemetry.KindEvent, Event: telemetry.EventMember},
		{Kind: telemetry.KindEvent, Event: telemetry.EventResync},
		{Kind: telemetry.KindEvent, Event: telemetry.EventEpoch},
		{Kind: telemetry.KindStep, Step: 2, Steps: 10, Loss: 2.25, SamplesPerS: 500, BytesSent: 600, Codec: "sint8",
			StepS: 0.02, ComputeS: 0.015, AllreduceS: 0.005, WaitS: 0},
		{Kind: telemetry.KindStep, Step: 3, Steps: 10, Loss: 2, SamplesPerS: 600, BytesSent: 4000, Codec: "none",
			StepS: 0.03, ComputeS: 0.02, AllreduceS: 0.01, WaitS: 0},
		{Kind: telemetry.KindEval, Step: 3, TestLoss: ptr(1.75), Accuracy: ptr(0.625)},
		{Kind: telemetry.KindEvent, Event: telemetry.EventCheckpoint},
	} {
		m.Add(r)
	}
}

// TestRunMetricsFromRecords: the step, evaluation and event records of a
// run become the training gauges, the bytes per codec, the event counters
// and the step-time histogram, and the whole lints clean.
func TestRunMetricsFromRecords(t *testing.T) {
	m := newRunMetrics()
	if n := testutil.CollectAndCount(m, "p2ptrain_training_step", "p2ptrain_training_loss", "p2ptrain_eval_accuracy_ratio"); n != 0 {
		t.Fatalf("%d training gauges before any record, want none", n)
	}
	feedRun(m)
	want := `
# HELP p2ptrain_allreduce_sent_bytes_total Bytes this peer sent for the all-reduces of completed steps, by the step's codec.
# TYPE p2ptrain_allreduce_sent_bytes_total counter
p2ptrain_allreduce_sent_bytes_total{codec="none"} 4000
p2ptrain_allreduce_sent_bytes_total{codec="sint8"} 1600
# HELP p2ptrain_eval_accuracy_ratio Test accuracy (0 to 1) at the latest evaluation (mlp and cnn).
# TYPE p2ptrain_eval_accuracy_ratio gauge
p2ptrain_eval_accuracy_ratio 0.625
# HELP p2ptrain_eval_loss Loss on held-out data at the latest evaluation.
# TYPE p2ptrain_eval_loss gauge
p2ptrain_eval_loss 1.75
# HELP p2ptrain_exclusions_total Members excluded from ring epochs, as this peer saw it (excluded events).
# TYPE p2ptrain_exclusions_total counter
p2ptrain_exclusions_total 1
# HELP p2ptrain_resyncs_total Times this peer replaced its training state with a member's (resync events).
# TYPE p2ptrain_resyncs_total counter
p2ptrain_resyncs_total 1
# HELP p2ptrain_ring_epoch_changes_total Ring epochs this peer adopted (epoch events).
# TYPE p2ptrain_ring_epoch_changes_total counter
p2ptrain_ring_epoch_changes_total 3
# HELP p2ptrain_steps_retried_total Step attempts that failed and were retried (step_failed events).
# TYPE p2ptrain_steps_retried_total counter
p2ptrain_steps_retried_total 2
# HELP p2ptrain_training_loss Training loss of the latest step on this peer's shard.
# TYPE p2ptrain_training_loss gauge
p2ptrain_training_loss 2
# HELP p2ptrain_training_samples_per_second Samples the cluster trained on per second in the latest step (global batch over step time).
# TYPE p2ptrain_training_samples_per_second gauge
p2ptrain_training_samples_per_second 600
# HELP p2ptrain_training_step Training steps this peer has completed (the latest step record).
# TYPE p2ptrain_training_step gauge
p2ptrain_training_step 3
# HELP p2ptrain_training_steps_planned Training steps the run is set to take (train.steps).
# TYPE p2ptrain_training_steps_planned gauge
p2ptrain_training_steps_planned 10
`
	names := []string{"p2ptrain_allreduce_sent_bytes_total", "p2ptrain_eval_accuracy_ratio", "p2ptrain_eval_loss",
		"p2ptrain_eval_bpb", "p2ptrain_exclusions_total", "p2ptrain_resyncs_total", "p2ptrain_ring_epoch_changes_total",
		"p2ptrain_steps_retried_total", "p2ptrain_training_loss", "p2ptrain_training_samples_per_second",
		"p2ptrain_training_step", "p2ptrain_training_steps_planned"}
	if err := testutil.CollectAndCompare(m, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	hist := stepHistograms(t, reg)
	for part, want := range map[string]struct {
		sum float64
		le  map[float64]uint64 // cumulative counts at some bounds
	}{
		partStep:      {0.25, map[float64]uint64{0.01: 0, 0.025: 1, 0.05: 2, 0.25: 3}},
		partCompute:   {0.185, map[float64]uint64{0.01: 0, 0.025: 2, 0.25: 3}},
		partAllreduce: {0.065, map[float64]uint64{0.001: 0, 0.005: 1, 0.01: 2, 0.05: 3}},
		partWait:      {3, map[float64]uint64{0.001: 2, 2.5: 2, 5: 3, 60: 3}},
	} {
		h := hist[part]
		if h == nil {
			t.Errorf("no step-time histogram for part %q", part)
			continue
		}
		if h.GetSampleCount() != 3 || !near(h.GetSampleSum(), want.sum) {
			t.Errorf("%s: %d samples summing to %g, want 3 summing to %g", part, h.GetSampleCount(), h.GetSampleSum(), want.sum)
		}
		for _, b := range h.GetBucket() {
			if c, ok := want.le[b.GetUpperBound()]; ok && b.GetCumulativeCount() != c {
				t.Errorf("%s: %d samples ≤ %g s, want %d", part, b.GetCumulativeCount(), b.GetUpperBound(), c)
			}
		}
		if bs := h.GetBucket(); len(bs) != len(stepBuckets) || bs[0].GetUpperBound() != 0.001 || bs[len(bs)-1].GetUpperBound() != 60 {
			t.Errorf("%s: %d buckets, want %d from 1 ms to 60 s", part, len(bs), len(stepBuckets))
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}

	// A language model's evaluation carries bits per byte, not accuracy.
	bpb, loss := 1.5, 1.04
	m.Add(telemetry.Record{Kind: telemetry.KindEval, Step: 4, TestLoss: &loss, BitsPerByte: &bpb})
	wantLM := `
# HELP p2ptrain_eval_bpb Held-out bits per byte at the latest evaluation (gpt): the loss in bits per byte of text.
# TYPE p2ptrain_eval_bpb gauge
p2ptrain_eval_bpb 1.5
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(wantLM), "p2ptrain_eval_bpb"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m, "p2ptrain_eval_accuracy_ratio"); n != 0 {
		t.Errorf("accuracy still exported after an evaluation without one")
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// stepHistograms returns p2ptrain_step_duration_seconds by part.
func stepHistograms(t *testing.T, g prometheus.Gatherer) map[string]*dto.Histogram {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.Histogram{}
	for _, mf := range mfs {
		if mf.GetName() != "p2ptrain_step_duration_seconds" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "part" {
					out[l.GetValue()] = mt.GetHistogram()
				}
			}
		}
	}
	return out
}

// TestMetricsEndpoint: /metrics serves the run's metrics from the records
// the node gets, the link figures in base units, the ring's and gossip's
// counters, and the Go runtime's and the process's metrics, lint-free.
func TestMetricsEndpoint(t *testing.T) {
	cfg := testConfig()
	cfg.Node.API = "127.0.0.1:0"
	cfg.Probe.Enabled = false // the prober would drop the link to a peer that is not a member
	n := startNode(t, cfg, nil)
	key, _, err := crypto.GenerateEd25519Key(bytes.NewReader(make([]byte, 32)))
	if err != nil {
		t.Fatal(err)
	}
	other, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	n.InjectLink(probe.LinkStatus{Peer: other.String(), MbitS: 80, RTTMs: 25, MeasuredAt: time.Now()})
	feedRun(n)
	body, err := get("http://" + n.APIAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	for _, want := range []string{
		"p2ptrain_training_step 3\n",
		"p2ptrain_training_loss 2\n",
		"p2ptrain_eval_accuracy_ratio 0.625\n",
		`p2ptrain_allreduce_sent_bytes_total{codec="sint8"} 1600` + "\n",
		`p2ptrain_step_duration_seconds_count{part="wait"} 3` + "\n",
		"p2ptrain_steps_retried_total 2\n",
		fmt.Sprintf("p2ptrain_link_throughput_bytes_per_second{peer=%q} 1e+07\n", other),
		fmt.Sprintf("p2ptrain_link_rtt_seconds{peer=%q} 0.025\n", other),
		"p2ptrain_allreduce_frames_rejected_total 0\n",
		"p2ptrain_allreduce_direct_links_total 0\n",
		"p2ptrain_pipeline_direct_links_total 0\n",
		"p2ptrain_ring_epochs_rejected_total 0\n",
		`p2ptrain_gossip_messages_total{direction="rate_limited"} 0` + "\n",
		"p2ptrain_alive_peers 1\n",
		"\ngo_goroutines ",
		"\nprocess_cpu_seconds_total ",
		"\nprocess_resident_memory_bytes ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestSinksGetTheRecordsTime: a record made without a time reaches the
// added sinks with the time /history shows for it.
func TestSinksGetTheRecordsTime(t *testing.T) {
	n := startNode(t, testConfig(), nil)
	var mu sync.Mutex
	var sunk []telemetry.Record
	n.AddSink(sinkFunc(func(r telemetry.Record) {
		if r.Event == telemetry.EventCheckpoint {
			mu.Lock()
			sunk = append(sunk, r)
			mu.Unlock()
		}
	}))
	n.Add(telemetry.Record{Kind: telemetry.KindEvent, Event: telemetry.EventCheckpoint, Message: "ckpt"})
	recs, _ := n.History(0)
	i := slices.IndexFunc(recs, func(r telemetry.Record) bool { return r.Event == telemetry.EventCheckpoint })
	mu.Lock()
	defer mu.Unlock()
	if len(sunk) != 1 || sunk[0].Time.IsZero() || i < 0 || !recs[i].Time.Equal(sunk[0].Time) {
		t.Fatalf("sink got %+v, history %+v: want the checkpoint once, with the history's time", sunk, recs)
	}
}
