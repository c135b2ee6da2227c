// Package p2ptest starts libp2p hosts on loopback for the protocol
// packages' tests.
package p2ptest

import (
	"context"
	"testing"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Host starts a libp2p host listening on a loopback TCP port; the test's
// cleanup closes it.
func Host(t testing.TB) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// Connect connects a to each of others.
func Connect(t testing.TB, a host.Host, others ...host.Host) {
	t.Helper()
	for _, b := range others {
		if err := a.Connect(context.Background(), peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
			t.Fatalf("connect %s to %s: %v", a.ID(), b.ID(), err)
		}
	}
}

// Pair starts two loopback hosts, a connected to b.
func Pair(t testing.TB) (a, b host.Host) {
	t.Helper()
	a, b = Host(t), Host(t)
	Connect(t, a, b)
	return a, b
}
