package node

import (
	"bytes"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/zap"
)

// peerIDOf returns the peer ID of the Ed25519 key seeded with seed.
func peerIDOf(t *testing.T, seed byte) peer.ID {
	t.Helper()
	priv, _, err := crypto.GenerateEd25519Key(bytes.NewReader(bytes.Repeat([]byte{seed}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestBootstrapPeersLeaveOutThisPeer: the entry naming this peer (one
// config file on every machine) is left out instead of dialled forever; an
// entry with only a peer ID is refused, naming it.
func TestBootstrapPeersLeaveOutThisPeer(t *testing.T) {
	self, other := peerIDOf(t, 1), peerIDOf(t, 2)
	boot, err := bootstrapPeers([]string{
		"/ip4/10.0.0.1/tcp/4001/p2p/" + self.String(),
		"/ip4/10.0.0.2/tcp/4001/p2p/" + other.String(),
	}, self, zap.NewNop())
	if err != nil || len(boot) != 1 || boot[0].ID != other {
		t.Fatalf("got %v, %v; want only %s", boot, err, other)
	}
	bare := "/p2p/" + other.String()
	if _, err := bootstrapPeers([]string{bare}, self, zap.NewNop()); err == nil || !strings.Contains(err.Error(), bare) || !strings.Contains(err.Error(), "only a peer ID") {
		t.Fatalf("a bare peer ID: %v", err)
	}
}
