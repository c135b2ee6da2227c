package node

import (
	"context"
	"math"
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
