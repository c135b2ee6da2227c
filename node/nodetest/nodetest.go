// Package nodetest holds what tests of loopback peers share: a fast
// configuration, a logger and polling with a deadline. It does not import
// package node, so node's own tests use it too.
package nodetest

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/p2ptrain/p2ptrain/config"
)

// Heartbeat and FailAfter are the fast failure detection of Config.
const (
	Heartbeat = 250 * time.Millisecond
	FailAfter = 1500 * time.Millisecond
)

// Config is a loopback-only peer with fast failure detection, no mDNS and
// no API.
func Config(bootstrap ...string) config.Config {
	cfg := config.DefaultConfig()
	cfg.Node.Cluster = "test"
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	cfg.Node.Bootstrap = bootstrap
	cfg.Node.MDNS = false
	cfg.Node.API = ""
	cfg.Gossip.Heartbeat = config.Duration(Heartbeat)
	cfg.Gossip.FailureTimeout = config.Duration(FailAfter)
	return cfg
}

// Logger is the test logger of a peer started with cfg, named after its
// bootstrap count: info and above ($P2PTRAIN_TEST_LOG=debug|warn|error
// changes it). Lines logged after t's cleanups ran are dropped: libp2p's
// goroutines (pubsub's loop) may log once more after a test killed its
// peers, and testing panics on a log after a test completed.
func Logger(t testing.TB, cfg config.Config) *zap.Logger {
	level := zapcore.InfoLevel
	if l, err := zapcore.ParseLevel(os.Getenv("P2PTRAIN_TEST_LOG")); err == nil {
		level = l
	}
	w := &untilCleanup{TB: t}
	t.Cleanup(w.stop)
	return zaptest.NewLogger(w, zaptest.Level(level)).Named(fmt.Sprint(len(cfg.Node.Bootstrap)))
}

// untilCleanup passes log lines to its test until stop.
type untilCleanup struct {
	testing.TB
	mu      sync.Mutex
	stopped bool
}

func (u *untilCleanup) stop() {
	u.mu.Lock()
	u.stopped = true
	u.mu.Unlock()
}

// Logf logs to the test unless it stopped.
func (u *untilCleanup) Logf(format string, args ...any) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.stopped {
		u.TB.Logf(format, args...)
	}
}

// Errorf reports a logger error to the test unless it stopped.
func (u *untilCleanup) Errorf(format string, args ...any) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.stopped {
		u.TB.Errorf(format, args...)
	}
}

// Eventually polls cond until it returns nil, failing the test if the
// deadline passes first, and returns how long it took.
func Eventually(t testing.TB, within time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s: %v", what, within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
