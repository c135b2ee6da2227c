package node

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/pnet"

	"github.com/p2ptrain/p2ptrain/config"
)

// TestMeasureWireCost: the transport's figures come out positive and
// finite without a swarm key and with one in either mode (the hosts
// connect with the cluster's security), and a measurement of no rounds is
// refused.
func TestMeasureWireCost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := make(pnet.PSK, 32)
	for i := range key {
		key[i] = byte(i)
	}
	for _, tc := range []struct {
		name string
		psk  pnet.PSK
		mode string
	}{{"no key", nil, ""}, {"noise", key, config.SwarmKeyNoise}, {"pnet", key, config.SwarmKeyPnet}} {
		w, err := MeasureWireCost(ctx, tc.psk, tc.mode, 20)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !(w.Message > 0) || !(w.Byte > 0) || math.IsInf(w.Message+w.Byte, 0) {
			t.Errorf("%s: %+v", tc.name, w)
		}
	}
	if _, err := MeasureWireCost(ctx, nil, "", 0); err == nil || !strings.Contains(err.Error(), "0 rounds") {
		t.Errorf("no rounds: %v", err)
	}
}

// TestNodeMeasuresItsOwnTransport: a node with a swarm key, in either
// mode, times the transport with its own security: the two hosts of the
// measurement connect (a mismatch of key or mode could not) and the
// figures come out positive.
func TestNodeMeasuresItsOwnTransport(t *testing.T) {
	for _, mode := range []string{config.SwarmKeyNoise, config.SwarmKeyPnet} {
		key := filepath.Join(t.TempDir(), "swarm.key")
		if err := WriteSwarmKey(key); err != nil {
			t.Fatal(err)
		}
		cfg := testConfig()
		cfg.Node.SwarmKey, cfg.Node.SwarmKeyMode = key, mode
		n := startNode(t, cfg, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		w, err := n.MeasureWireCost(ctx, 10)
		cancel()
		if err != nil || !(w.Message > 0) || !(w.Byte > 0) {
			t.Errorf("%s: %+v, %v", mode, w, err)
		}
		if n.psk == nil {
			t.Errorf("%s: the node kept no swarm key to measure with", mode)
		}
	}
}
