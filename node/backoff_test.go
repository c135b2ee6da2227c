package node

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
)

// TestClearDialBackoffLetsAMemberBeDialedAgain: a dial that failed (the
// peer was not listening yet) puts the peer in libp2p's dial back-off, and
// dials fail at once even after it listens; clearDialBackoff, which runs
// before every ring stream and state fetch to a member, makes the next
// dial a real one. (Under 1 % packet loss a peer could not open its ring
// stream for the back-off's length and was excluded.)
func TestClearDialBackoffLetsAMemberBeDialedAgain(t *testing.T) {
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	newHost := func(listen string, k crypto.PrivKey) host.Host {
		opts := []libp2p.Option{libp2p.ListenAddrStrings(listen), libp2p.DisableMetrics()}
		if k != nil {
			opts = append(opts, libp2p.Identity(k))
		}
		h, err := libp2p.New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	b := newHost("/ip4/127.0.0.1/tcp/0", key)
	info := peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}
	b.Close()
	a := newHost("/ip4/127.0.0.1/tcp/0", nil)
	defer a.Close()
	a.Peerstore().AddAddrs(info.ID, info.Addrs, peerstore.PermanentAddrTTL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Connect(ctx, info); err == nil {
		t.Fatal("dialed a closed host")
	}
	b = newHost(info.Addrs[0].String(), key) // listening again, same identity and address
	defer b.Close()
	if err := a.Connect(ctx, info); !errors.Is(err, swarm.ErrDialBackoff) {
		t.Fatalf("second dial: %v, want the dial back-off (the premise of this test)", err)
	}
	clearDialBackoff(a, info.ID)
	if err := a.Connect(ctx, info); err != nil {
		t.Fatalf("dial after clearDialBackoff: %v", err)
	}
}
