// Package nodetest starts loopback peers for the tests of packages built on
// package node.
package nodetest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/node"
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

// Start starts a node that is killed when the test ends. With log nil it
// logs warnings to the test ($P2PTRAIN_TEST_LOG=debug|info shows more).
func Start(t testing.TB, cfg config.Config, log *zap.Logger) *node.Node {
	t.Helper()
	if log == nil {
		level := zapcore.WarnLevel
		if l, err := zapcore.ParseLevel(os.Getenv("P2PTRAIN_TEST_LOG")); err == nil {
			level = l
		}
		log = zaptest.NewLogger(t, zaptest.Level(level)).Named(fmt.Sprint(len(cfg.Node.Bootstrap)))
	}
	n, err := node.New(context.Background(), cfg, log)
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() { n.Kill() })
	return n
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
