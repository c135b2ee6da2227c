package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/p2ptrain/p2ptrain/config"
)

func TestSwarmKeyPrologue(t *testing.T) {
	a, b := pnet.PSK(bytes.Repeat([]byte{1}, 32)), pnet.PSK(bytes.Repeat([]byte{2}, 32))
	pa, err := swarmKeyPrologue(a)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := swarmKeyPrologue(a)
	pb, _ := swarmKeyPrologue(b)
	switch {
	case len(pa) != 32:
		t.Fatalf("prologue of %d bytes, want 32", len(pa))
	case !bytes.Equal(pa, again):
		t.Fatal("one key gave two prologues")
	case bytes.Equal(pa, pb):
		t.Fatal("two keys gave one prologue")
	case bytes.Equal(pa, a):
		t.Fatal("the prologue is the key itself")
	}
	if _, err := swarmKeyPrologue(nil); err == nil {
		t.Fatal("an empty key gave a prologue")
	}
}

// TestSwarmKeyRefusesOutsiders: in either node.swarm_key_mode a peer with
// the key connects and a peer with another key, without a key, or with the
// key in the other mode does not: its dial fails and it holds no
// connection. In mode noise both sides say why in their logs: the dialer
// with another key gets ErrSwarmKeyMismatch and a warning, and the keyed
// peer warns of every refused dialer.
func TestSwarmKeyRefusesOutsiders(t *testing.T) {
	keys := swarmKeys(t, 2)
	key, other := keys[0], keys[1]
	for _, mode := range []string{config.SwarmKeyNoise, config.SwarmKeyPnet} {
		t.Run(mode, func(t *testing.T) {
			cfg := testConfig()
			cfg.Node.SwarmKey, cfg.Node.SwarmKeyMode = key, mode
			core, logs := observer.New(zapcore.WarnLevel)
			a := startNode(t, cfg, zap.New(core))
			target := peer.AddrInfo{ID: a.ID(), Addrs: a.Host().Addrs()}

			cfg = testConfig()
			cfg.Node.SwarmKey, cfg.Node.SwarmKeyMode = key, mode
			member := startNode(t, cfg, nil)
			if err := dial(member, target); err != nil {
				t.Fatalf("a peer with the key and mode %s: %v", mode, err)
			}

			otherMode := config.SwarmKeyPnet
			if mode == config.SwarmKeyPnet {
				otherMode = config.SwarmKeyNoise
			}
			outsiders := []struct {
				name, key, mode string
			}{
				{"another key", other, mode},
				{"no key", "", config.SwarmKeyNoise},
				{"the key in mode " + otherMode, key, otherMode},
			}
			for _, o := range outsiders {
				cfg := testConfig()
				cfg.Node.SwarmKey, cfg.Node.SwarmKeyMode = o.key, o.mode
				ocore, ologs := observer.New(zapcore.WarnLevel)
				n := startNode(t, cfg, zap.New(ocore))
				err := dial(n, target)
				if err == nil {
					t.Fatalf("%s: connected", o.name)
				}
				if peers := n.Host().Network().Peers(); len(peers) != 0 {
					t.Fatalf("%s: holds connections to %v", o.name, peers)
				}
				if mode == config.SwarmKeyNoise && o.mode == config.SwarmKeyNoise && o.key != "" {
					if !errors.Is(err, ErrSwarmKeyMismatch) {
						t.Errorf("%s: dial error %v does not say the swarm key differs", o.name, err)
					}
					if ologs.FilterMessageSnippet("does not hold this cluster's swarm key").Len() == 0 {
						t.Errorf("%s: the dialer logged no refusal", o.name)
					}
				}
				t.Logf("%s: %v", o.name, err)
			}
			if mode == config.SwarmKeyNoise {
				// The dialers with another key and without one reached the
				// handshake (one IP: one warning per refusalLogEvery).
				if logs.FilterMessageSnippet("failed the Noise handshake bound to the swarm key").Len() == 0 {
					t.Errorf("the keyed peer logged no refused dialer; its warnings: %v", logs.All())
				}
			}
			if got := a.Host().Network().Peers(); len(got) != 1 || got[0] != member.ID() {
				t.Fatalf("the keyed peer is connected to %v, want only %s", got, member.ID())
			}
		})
	}
}

// swarmKeys writes n swarm keys into a temporary directory and returns
// their paths.
func swarmKeys(t *testing.T, n int) []string {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("%d.key", i))
		if err := WriteSwarmKey(p); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

// dial connects n to target directly, within 10 s.
func dial(n *Node, target peer.AddrInfo) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.Host().Connect(ctx, target)
}
