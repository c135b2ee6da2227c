package ringstream

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/zap/zaptest"

	"github.com/p2ptrain/p2ptrain/allreduce"
)

func newHost(t *testing.T) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestSentCountsOnlyWrittenFrames: Sent counts the frames that were written
// and none that failed (it once counted a frame before its write failed).
func TestSentCountsOnlyWrittenFrames(t *testing.T) {
	a, b := newHost(t), newHost(t)
	if err := a.Connect(context.Background(), peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t)
	sa, sb := New(a, 1<<20, nil, log), New(b, 1<<20, nil, log)
	defer sa.Close()
	ep := allreduce.Epoch{Number: 1, Peers: []allreduce.PeerID{allreduce.PeerID(a.ID().String()), allreduce.PeerID(b.ID().String())}}
	ea, eb := ep, ep
	ea.Self, eb.Self = ep.Peers[0], ep.Peers[1]
	ta, tb := sa.Open(ea), sb.Open(eb)
	frame := make([]byte, 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ta.Send(ctx, eb.Self, frame); err != nil {
		t.Fatal(err)
	}
	if got, err := tb.Recv(ctx, ea.Self); err != nil || len(got) != len(frame) {
		t.Fatalf("received %d bytes, %v", len(got), err)
	}
	// b goes away: a's writes fail once the reset reaches it.
	sb.Close()
	b.Close()
	sent := 1
	var err error
	for i := 0; i < 1000 && err == nil; i++ {
		if err = ta.Send(ctx, eb.Self, frame); err == nil {
			sent++
		}
	}
	if err == nil {
		t.Fatal("sends to a closed peer kept succeeding")
	}
	if want := uint64(sent * (4 + len(frame))); ta.Sent() != want || sa.Sent() != want {
		t.Fatalf("%d frames written: transport counted %d bytes, service %d, want %d", sent, ta.Sent(), sa.Sent(), want)
	}
}
