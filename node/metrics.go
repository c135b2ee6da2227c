package node

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/p2ptrain/p2ptrain/telemetry"
)

// newRegistry returns what GET /metrics serves: the node's figures, read at
// scrape time; the run's metrics, fed from the node's records from now on;
// and the Go runtime's and the process's standard metrics.
func newRegistry(n *Node) *prometheus.Registry {
	run := newRunMetrics()
	n.AddSink(run)
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(n), run, collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// stepBuckets are the upper bounds of p2ptrain_step_duration_seconds: a
// millisecond to a minute, in 1-2.5-5 steps.
var stepBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// The parts of a step that p2ptrain_step_duration_seconds tells apart.
const (
	partStep      = "step"
	partCompute   = "compute"
	partAllreduce = "allreduce"
	partWait      = "wait"
)

// unknownCodec labels the bytes of step records that name no codec.
const unknownCodec = "unknown"

// runMetrics turns a run's timeline into Prometheus metrics: it is the
// telemetry.Sink that reads the records and the prometheus.Collector that
// exports the figures. Gauges appear once a record has set them; counters
// and the histogram start at zero.
type runMetrics struct {
	step, stepsPlanned, loss, samplesPerS *prometheus.Desc
	evalLoss, accuracy, bpb               *prometheus.Desc

	durations *prometheus.HistogramVec
	sent      *prometheus.CounterVec
	events    map[string]prometheus.Counter

	mu sync.Mutex
	// last is the latest step record, eval the latest evaluation (nil
	// until there is one).
	last, eval *telemetry.Record
}

func newRunMetrics() *runMetrics {
	m := &runMetrics{
		step:         prometheus.NewDesc("p2ptrain_training_step", "Training steps this peer has completed (the latest step record).", nil, nil),
		stepsPlanned: prometheus.NewDesc("p2ptrain_training_steps_planned", "Training steps the run is set to take (train.steps).", nil, nil),
		loss:         prometheus.NewDesc("p2ptrain_training_loss", "Training loss of the latest step on this peer's shard.", nil, nil),
		samplesPerS:  prometheus.NewDesc("p2ptrain_training_samples_per_second", "Samples the cluster trained on per second in the latest step (global batch over step time).", nil, nil),
		evalLoss:     prometheus.NewDesc("p2ptrain_eval_loss", "Loss on held-out data at the latest evaluation.", nil, nil),
		accuracy:     prometheus.NewDesc("p2ptrain_eval_accuracy_ratio", "Test accuracy (0 to 1) at the latest evaluation (mlp and cnn).", nil, nil),
		bpb:          prometheus.NewDesc("p2ptrain_eval_bpb", "Held-out bits per byte at the latest evaluation (gpt): the loss in bits per byte of text.", nil, nil),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "p2ptrain_step_duration_seconds",
			Help:    "Time of each training step by part: step (its wall time) = compute (forward, backward, optimizer) + allreduce (communication not hidden behind backward); wait is the time before the step spent outside any step (waiting for an epoch or members, state sync, failed attempts).",
			Buckets: stepBuckets,
		}, []string{"part"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "p2ptrain_allreduce_sent_bytes_total",
			Help: "Bytes this peer sent for the all-reduces of completed steps, by the step's codec.",
		}, []string{"codec"}),
		events: map[string]prometheus.Counter{},
	}
	for _, part := range []string{partStep, partCompute, partAllreduce, partWait} {
		m.durations.WithLabelValues(part)
	}
	for event, c := range map[string]struct{ name, help string }{
		telemetry.EventStepFailed: {"p2ptrain_steps_retried_total", "Step attempts that failed and were retried (step_failed events)."},
		telemetry.EventResync:     {"p2ptrain_resyncs_total", "Times this peer replaced its training state with a member's (resync events)."},
		telemetry.EventEpoch:      {"p2ptrain_ring_epoch_changes_total", "Ring epochs this peer adopted (epoch events)."},
		telemetry.EventExcluded:   {"p2ptrain_exclusions_total", "Members excluded from ring epochs, as this peer saw it (excluded events)."},
	} {
		m.events[event] = prometheus.NewCounter(prometheus.CounterOpts{Name: c.name, Help: c.help})
	}
	return m
}

// Add implements telemetry.Sink.
func (m *runMetrics) Add(r telemetry.Record) {
	switch r.Kind {
	case telemetry.KindStep:
		m.durations.WithLabelValues(partStep).Observe(r.StepS)
		m.durations.WithLabelValues(partCompute).Observe(r.ComputeS)
		m.durations.WithLabelValues(partAllreduce).Observe(r.AllreduceS)
		m.durations.WithLabelValues(partWait).Observe(r.WaitS)
		codec := r.Codec
		if codec == "" {
			codec = unknownCodec
		}
		m.sent.WithLabelValues(codec).Add(max(r.BytesSent, 0))
		m.mu.Lock()
		m.last = &r
		m.mu.Unlock()
	case telemetry.KindEval:
		m.mu.Lock()
		m.eval = &r
		m.mu.Unlock()
	case telemetry.KindEvent:
		if c := m.events[r.Event]; c != nil {
			c.Inc()
		}
	}
}

// Describe implements prometheus.Collector.
func (m *runMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.step, m.stepsPlanned, m.loss, m.samplesPerS, m.evalLoss, m.accuracy, m.bpb} {
		ch <- d
	}
	m.durations.Describe(ch)
	m.sent.Describe(ch)
	for _, c := range m.events {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *runMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	last, eval := m.last, m.eval
	m.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	if last != nil {
		gauge(m.step, float64(last.Step))
		gauge(m.stepsPlanned, float64(last.Steps))
		gauge(m.loss, last.Loss)
		gauge(m.samplesPerS, last.SamplesPerS)
	}
	if eval != nil {
		for _, g := range []struct {
			d *prometheus.Desc
			v *float64
		}{{m.evalLoss, eval.TestLoss}, {m.accuracy, eval.Accuracy}, {m.bpb, eval.BitsPerByte}} {
			if g.v != nil {
				gauge(g.d, *g.v)
			}
		}
	}
	m.durations.Collect(ch)
	m.sent.Collect(ch)
	for _, c := range m.events {
		c.Collect(ch)
	}
}

// collector exports the node's figures to Prometheus at scrape time.
type collector struct {
	n                                   *Node
	alive, epoch, gossipMsgs, protoByte *prometheus.Desc
	linkRate, linkRTT                   *prometheus.Desc
	framesRejected, epochsRejected      *prometheus.Desc
	directLinks, pipeDirectLinks        *prometheus.Desc
}

func newCollector(n *Node) *collector {
	return &collector{
		n:               n,
		alive:           prometheus.NewDesc("p2ptrain_alive_peers", "Alive members of the cluster, this peer included.", nil, nil),
		epoch:           prometheus.NewDesc("p2ptrain_ring_epoch", "Number of the adopted ring epoch.", nil, nil),
		gossipMsgs:      prometheus.NewDesc("p2ptrain_gossip_messages_total", "Gossip messages by direction: in (accepted from other peers), out (published), rejected (refused by the validator), rate_limited (ignored: the author sent too many).", []string{"direction"}, nil),
		protoByte:       prometheus.NewDesc("p2ptrain_protocol_bytes_total", "Bytes sent and received per libp2p protocol.", []string{"protocol", "direction"}, nil),
		linkRate:        prometheus.NewDesc("p2ptrain_link_throughput_bytes_per_second", "Measured throughput from this peer to a peer, in bytes per second (the probes' Mbit/s × 125000).", []string{"peer"}, nil),
		linkRTT:         prometheus.NewDesc("p2ptrain_link_rtt_seconds", "Measured round-trip time to a peer.", []string{"peer"}, nil),
		framesRejected:  prometheus.NewDesc("p2ptrain_allreduce_frames_rejected_total", "All-reduce frames from peers that this peer refused (invalid, of another epoch or codec, too large); each fails its step.", nil, nil),
		epochsRejected:  prometheus.NewDesc("p2ptrain_ring_epochs_rejected_total", "Ring epochs this peer refused to adopt (numbers out of bounds, proposers it does not follow).", nil, nil),
		directLinks:     prometheus.NewDesc("p2ptrain_allreduce_direct_links_total", "All-reduce links this peer opened as direct links (a TCP connection of their own, AES-256-GCM), as sender or receiver; the others carry their frames on libp2p streams.", nil, nil),
		pipeDirectLinks: prometheus.NewDesc("p2ptrain_pipeline_direct_links_total", "Pipeline links between stages this peer opened as direct links, as sender or receiver (allreduce.direct_links).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.alive, c.epoch, c.gossipMsgs, c.protoByte, c.linkRate, c.linkRTT, c.framesRejected, c.epochsRejected, c.directLinks, c.pipeDirectLinks} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	_, epoch := c.n.gsp.Snapshot()
	ch <- prometheus.MustNewConstMetric(c.alive, prometheus.GaugeValue, float64(c.n.AliveCount()))
	ch <- prometheus.MustNewConstMetric(c.epoch, prometheus.GaugeValue, float64(epoch.Number))
	st := c.n.gsp.Stats()
	for direction, v := range map[string]uint64{"in": st.In, "out": st.Out, "rejected": st.Rejected, "rate_limited": st.RateLimited} {
		ch <- prometheus.MustNewConstMetric(c.gossipMsgs, prometheus.CounterValue, float64(v), direction)
	}
	ch <- prometheus.MustNewConstMetric(c.epochsRejected, prometheus.CounterValue, float64(st.EpochsRejected))
	ch <- prometheus.MustNewConstMetric(c.framesRejected, prometheus.CounterValue, float64(c.n.ring.Rejected()))
	ch <- prometheus.MustNewConstMetric(c.directLinks, prometheus.CounterValue, float64(c.n.ring.DirectLinks()))
	ch <- prometheus.MustNewConstMetric(c.pipeDirectLinks, prometheus.CounterValue, float64(c.n.pipe.DirectLinks()))
	for _, l := range c.n.probe.Figures() {
		ch <- prometheus.MustNewConstMetric(c.linkRate, prometheus.GaugeValue, l.MbitS*1e6/8, l.Peer)
		ch <- prometheus.MustNewConstMetric(c.linkRTT, prometheus.GaugeValue, l.RTTMs/1e3, l.Peer)
	}
	for proto, s := range c.n.bw.GetBandwidthByProtocol() {
		if proto == "" {
			proto = "(connection setup)"
		}
		ch <- prometheus.MustNewConstMetric(c.protoByte, prometheus.CounterValue, float64(s.TotalIn), string(proto), "in")
		ch <- prometheus.MustNewConstMetric(c.protoByte, prometheus.CounterValue, float64(s.TotalOut), string(proto), "out")
	}
}
