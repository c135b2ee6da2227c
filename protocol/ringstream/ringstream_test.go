package ringstream

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"go.uber.org/zap/zaptest"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/internal/p2ptest"
)

// servicePair starts two connected loopback hosts, each with a Service.
func servicePair(t *testing.T) (a, b host.Host, sa, sb *Service) {
	a, b = p2ptest.Pair(t)
	log := zaptest.NewLogger(t)
	return a, b, New(a, 1<<20, nil, log), New(b, 1<<20, nil, log)
}

// TestSentCountsOnlyWrittenFrames: Sent counts the frames that were written
// and none that failed (it once counted a frame before its write failed).
func TestSentCountsOnlyWrittenFrames(t *testing.T) {
	a, b, sa, sb := servicePair(t)
	defer sa.Close()
	ep := allreduce.Ring{Number: 1, Peers: []allreduce.PeerID{allreduce.PeerID(a.ID().String()), allreduce.PeerID(b.ID().String())}}
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

// TestRingsUnderOneNumberDoNotMix: two rings adopted under one epoch number
// (different digests) never exchange frames; a stream reaches the transport
// whose number and digest both match, even when it arrives before that
// transport opens.
func TestRingsUnderOneNumberDoNotMix(t *testing.T) {
	a, b, sa, sb := servicePair(t)
	defer sa.Close()
	defer sb.Close()
	pa, pb := allreduce.PeerID(a.ID().String()), allreduce.PeerID(b.ID().String())
	ring := func(self allreduce.PeerID, digest string) allreduce.Ring {
		return allreduce.Ring{Number: 7, Peers: []allreduce.PeerID{pa, pb}, Self: self, Digest: digest}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tb := sb.Open(ring(pb, "bbbb"))
	if err := sa.Open(ring(pa, "aaaa")).Send(ctx, pb, []byte("ring a")); err != nil {
		t.Fatal(err)
	}
	if err := sa.Open(ring(pa, "bbbb")).Send(ctx, pb, []byte("ring b")); err != nil {
		t.Fatal(err)
	}
	got, err := tb.Recv(ctx, pa)
	if err != nil || string(got) != "ring b" {
		t.Fatalf("ring b's transport received %q, %v; want \"ring b\"", got, err)
	}
	// The other ring's stream waited for its own epoch.
	got, err = sb.Open(ring(pb, "aaaa")).Recv(ctx, pa)
	if err != nil || string(got) != "ring a" {
		t.Fatalf("ring a's transport received %q, %v; want \"ring a\"", got, err)
	}
}

// TestReadHello: the header round-trips and an oversized or truncated
// digest is an error, not a panic or a huge allocation.
func TestReadHello(t *testing.T) {
	k := epochKey{number: 1<<40 + 3, digest: "0123456789abcdef"}
	got, err := readHello(bytes.NewReader(appendHello(nil, k)))
	if err != nil || got != k {
		t.Fatalf("readHello = %+v, %v; want %+v", got, err, k)
	}
	long := appendHello(nil, epochKey{number: 1})
	long[8] = MaxDigest + 1
	long = append(long, make([]byte, MaxDigest+1)...)
	if _, err := readHello(bytes.NewReader(long)); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("digest of %d bytes: err = %v, want one naming the limit", MaxDigest+1, err)
	}
	short := appendHello(nil, k)
	if _, err := readHello(bytes.NewReader(short[:len(short)-1])); err == nil {
		t.Fatal("truncated digest accepted")
	}
}

// TestRejectedCountsRefusedFrames: a frame that the receiving session
// refuses is counted by the receiver's service, not by the sender's.
func TestRejectedCountsRefusedFrames(t *testing.T) {
	a, b, sa, sb := servicePair(t)
	defer sa.Close()
	defer sb.Close()
	ep := allreduce.Ring{Number: 3, Peers: []allreduce.PeerID{allreduce.PeerID(a.ID().String()), allreduce.PeerID(b.ID().String())}}
	ea, eb := ep, ep
	ea.Self, eb.Self = ep.Peers[0], ep.Peers[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sa.Open(ea).Send(ctx, eb.Self, []byte("not an all-reduce frame, but long enough to have a header")); err != nil {
		t.Fatal(err)
	}
	sess, err := allreduce.NewSession(eb, sb.Open(eb), allreduce.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	const n = 1000
	codec, err := compress.New("none", compress.Options{Layout: compress.FlatLayout(n)})
	if err != nil {
		t.Fatal(err)
	}
	r := sess.NewRound(ctx, 0)
	_ = r.Add(allreduce.Bucket{Codec: codec, Data: make([]float32, n), Out: make([]float32, n)})
	if err := r.Wait(); !errors.Is(err, allreduce.ErrBadFrame) {
		t.Fatalf("round over a garbage frame: %v, want ErrBadFrame", err)
	}
	if sb.Rejected() != 1 || sa.Rejected() != 0 {
		t.Fatalf("rejected frames: receiver %d, sender %d; want 1 and 0", sb.Rejected(), sa.Rejected())
	}
}
