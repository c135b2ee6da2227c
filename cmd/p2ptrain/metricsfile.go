package main

import (
	"fmt"
	"sync"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

// metricsSink is the run's metrics file (log.metrics_file, --metrics-file):
// a telemetry sink that writes the node's records as JSON Lines until it
// is closed, and drops those that come later (the node's leaving).
type metricsSink struct {
	mu   sync.Mutex
	f    *telemetry.File
	done bool
}

// openMetricsFile creates cfg.Log.MetricsFile and passes it every record
// n gets from now on, each naming the run after node.name or, without one,
// the peer ID. It returns nil when no file is set.
func openMetricsFile(n *node.Node, cfg config.Config) (*metricsSink, error) {
	if cfg.Log.MetricsFile == "" {
		return nil, nil
	}
	run := cfg.Node.Name
	if run == "" {
		run = n.ID().String()
	}
	f, err := telemetry.CreateFile(cfg.Log.MetricsFile, run)
	if err != nil {
		return nil, fmt.Errorf("log.metrics_file: %w", err)
	}
	m := &metricsSink{f: f}
	n.AddSink(m)
	return m, nil
}

// Add implements telemetry.Sink.
func (m *metricsSink) Add(r telemetry.Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.done {
		m.f.Add(r)
	}
}

// Close closes the file and returns the first error met writing or closing
// it; later calls do nothing and return nil, so a deferred Close does not
// report again what an earlier one returned. A nil *metricsSink closes
// without error.
func (m *metricsSink) Close() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return nil
	}
	m.done = true
	if err := m.f.Close(); err != nil {
		return fmt.Errorf("log.metrics_file: %w", err)
	}
	return nil
}
