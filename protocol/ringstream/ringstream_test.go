package ringstream

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"go.uber.org/zap/zaptest"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/internal/p2ptest"
	"github.com/p2ptrain/p2ptrain/protocol/directlink"
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

// pairEpoch opens epoch number on both services of a pair.
func pairEpoch(a, b host.Host, sa, sb *Service, number uint64) (ta, tb *Transport, pa, pb allreduce.PeerID) {
	pa, pb = allreduce.PeerID(a.ID().String()), allreduce.PeerID(b.ID().String())
	ep := allreduce.Ring{Number: number, Peers: []allreduce.PeerID{pa, pb}}
	ea, eb := ep, ep
	ea.Self, eb.Self = pa, pb
	return sa.Open(ea), sb.Open(eb), pa, pb
}

// epochPair is a service pair (closed when the test ends), a context of
// 10 s, and epoch 1 open on both.
type epochPair struct {
	ctx    context.Context
	a, b   host.Host
	sa, sb *Service
	ta, tb *Transport
	pa, pb allreduce.PeerID
}

func newEpochPair(t *testing.T) *epochPair {
	p := &epochPair{}
	p.a, p.b, p.sa, p.sb = servicePair(t)
	t.Cleanup(p.sa.Close)
	t.Cleanup(p.sb.Close)
	var cancel context.CancelFunc
	p.ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	p.ta, p.tb, p.pa, p.pb = pairEpoch(p.a, p.b, p.sa, p.sb, 1)
	return p
}

// exchange sends frames of the given sizes from ta to tb and checks that
// they arrive whole and in order.
func exchange(t *testing.T, ctx context.Context, ta, tb *Transport, pa, pb allreduce.PeerID, sizes ...int) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		for i, n := range sizes {
			f := bytes.Repeat([]byte{byte(i + 1)}, n)
			if err := ta.Send(ctx, pb, f); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i, n := range sizes {
		got, err := tb.Recv(ctx, pa)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{byte(i + 1)}, n)) {
			t.Fatalf("frame %d (%d bytes) arrived as %d other bytes", i, n, len(got))
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestFramesGoOverADirectLink: between two peers on TCP, an epoch's frames
// go over a direct link (both ends count it), whole and in order.
func TestFramesGoOverADirectLink(t *testing.T) {
	p := newEpochPair(t)
	exchange(t, p.ctx, p.ta, p.tb, p.pa, p.pb, 0, 1, 1000, 1<<20, 17)
	if p.sa.DirectLinks() != 1 || p.sb.DirectLinks() != 1 {
		t.Fatalf("direct links: opener %d, receiver %d; want 1 and 1", p.sa.DirectLinks(), p.sb.DirectLinks())
	}
	if want := uint64(5*4 + 1000 + 1<<20 + 18); p.ta.Sent() != want {
		t.Fatalf("sent %d bytes, want %d (frames and their length prefixes)", p.ta.Sent(), want)
	}
}

// TestDirectOffUsesTheStream: when either end has direct links off, the
// frames go over the libp2p stream.
func TestDirectOffUsesTheStream(t *testing.T) {
	for _, off := range []string{"opener", "receiver"} {
		t.Run(off, func(t *testing.T) {
			a, b, sa, sb := servicePair(t)
			defer sa.Close()
			defer sb.Close()
			map[string]*Service{"opener": sa, "receiver": sb}[off].SetDirect(false)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ta, tb, pa, pb := pairEpoch(a, b, sa, sb, 1)
			exchange(t, ctx, ta, tb, pa, pb, 10, 1<<20)
			if sa.DirectLinks() != 0 || sb.DirectLinks() != 0 {
				t.Fatalf("direct links %d and %d with the %s's off", sa.DirectLinks(), sb.DirectLinks(), off)
			}
		})
	}
}

// hookDials makes every direct dial of sa go through dial (whichever end
// of the link dials) and counts them.
func hookDials(sa *Service, dial func(ctx context.Context, ip net.IP, offer []byte) (net.IP, []byte)) *int {
	dials := new(int)
	sa.links.Dial = func(ctx context.Context, ip net.IP, offer []byte) (*directlink.Writer, error) {
		*dials++
		ip, offer = dial(ctx, ip, offer)
		if ip == nil {
			return nil, errors.New("unreachable (test)")
		}
		return directlink.Dial(ctx, ip, offer)
	}
	sa.links.DialReader = func(ctx context.Context, ip net.IP, offer []byte, maxFrame int) (*directlink.Reader, error) {
		*dials++
		ip, offer = dial(ctx, ip, offer)
		if ip == nil {
			return nil, errors.New("unreachable (test)")
		}
		return directlink.DialReader(ctx, ip, offer, maxFrame)
	}
	return dials
}

// bothWays runs f for the two directions of a pair whose host a dialed
// host b: frames from a to b (b accepted the connection and listens, a
// dials as the opener) and from b to a (b listens as the opener, a dials
// as the receiver). In both, a dials.
func bothWays(t *testing.T, f func(t *testing.T, p *epochPair, send, recv *Transport, from, to allreduce.PeerID)) {
	for _, way := range []string{"receiver listens", "opener listens"} {
		t.Run(way, func(t *testing.T) {
			p := newEpochPair(t)
			if c := p.a.Network().ConnsToPeer(p.b.ID()); len(c) != 1 || c[0].Stat().Direction != network.DirOutbound {
				t.Fatal("host a did not dial the one connection to host b")
			}
			if way == "receiver listens" {
				f(t, p, p.ta, p.tb, p.pa, p.pb)
			} else {
				f(t, p, p.tb, p.ta, p.pb, p.pa)
			}
		})
	}
}

// TestTheAcceptingEndListens: the end that accepted the libp2p connection
// listens for the direct link in both directions, so only the end that
// dialed the connection dials links (a peer behind a NAT dials out).
func TestTheAcceptingEndListens(t *testing.T) {
	bothWays(t, func(t *testing.T, p *epochPair, send, recv *Transport, from, to allreduce.PeerID) {
		dials := hookDials(p.sa, func(_ context.Context, ip net.IP, offer []byte) (net.IP, []byte) { return ip, offer })
		hookDials(p.sb, func(context.Context, net.IP, []byte) (net.IP, []byte) {
			t.Error("host b dialed a direct link")
			return nil, nil
		})
		exchange(t, p.ctx, send, recv, from, to, 10, 1<<20)
		if *dials != 1 || p.sa.DirectLinks() != 1 || p.sb.DirectLinks() != 1 {
			t.Fatalf("host a dialed %d times, direct links %d and %d; want 1, 1 and 1", *dials, p.sa.DirectLinks(), p.sb.DirectLinks())
		}
	})
}

// fallsBackOnce checks, in both ways (bothWays), that with host a's
// dials redirected by dial the epoch's frames go over the stream, and the
// next epoch's too, after one dial in all. A listening end waits 300 ms
// for a dial.
func fallsBackOnce(t *testing.T, dial func(ctx context.Context, ip net.IP, offer []byte) (net.IP, []byte)) {
	bothWays(t, func(t *testing.T, p *epochPair, send, recv *Transport, from, to allreduce.PeerID) {
		p.sa.links.AcceptTimeout, p.sb.links.AcceptTimeout = 300*time.Millisecond, 300*time.Millisecond
		dials := hookDials(p.sa, dial)
		exchange(t, p.ctx, send, recv, from, to, 100, 70000)
		ta, tb, _, _ := pairEpoch(p.a, p.b, p.sa, p.sb, 2)
		if send == p.tb {
			ta, tb = tb, ta
		}
		exchange(t, p.ctx, ta, tb, from, to, 100)
		if *dials != 1 || p.sa.DirectLinks() != 0 || p.sb.DirectLinks() != 0 {
			t.Fatalf("%d dials, direct links %d and %d; want 1 dial and none", *dials, p.sa.DirectLinks(), p.sb.DirectLinks())
		}
	})
}

// TestDirectDialFailureFallsBackToTheStream: a direct link that cannot be
// dialed sends the epoch's frames over the stream, and the next epoch does
// not dial that peer again.
func TestDirectDialFailureFallsBackToTheStream(t *testing.T) {
	fallsBackOnce(t, func(context.Context, net.IP, []byte) (net.IP, []byte) { return nil, nil })
}

// TestCloseDeliversWrittenFrames: frames written just before the opener's
// transport closes still reach the receiver over the direct link.
func TestCloseDeliversWrittenFrames(t *testing.T) {
	p := newEpochPair(t)
	const frames = 20
	for i := 0; i < frames; i++ {
		if err := p.ta.Send(p.ctx, p.pb, bytes.Repeat([]byte{byte(i)}, 100000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.ta.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < frames; i++ {
		got, err := p.tb.Recv(p.ctx, p.pa)
		if err != nil || len(got) != 100000 || got[0] != byte(i) {
			t.Fatalf("frame %d after the close: %d bytes, %v", i, len(got), err)
		}
	}
	if p.sb.DirectLinks() != 1 {
		t.Fatalf("receiver counted %d direct links, want 1", p.sb.DirectLinks())
	}
}

// TestLostConnectionBreaksTheDirectLink: when the libp2p connection to the
// opener goes away, a receive waiting on its direct link fails at once
// instead of waiting on a TCP connection nobody writes to.
func TestLostConnectionBreaksTheDirectLink(t *testing.T) {
	p := newEpochPair(t)
	exchange(t, p.ctx, p.ta, p.tb, p.pa, p.pb, 10)
	errc := make(chan error, 1)
	go func() {
		_, err := p.tb.Recv(p.ctx, p.pa)
		errc <- err
	}()
	// Close only the libp2p connection: both services, and so both ends
	// of the direct link, stay open.
	if err := p.b.Network().ClosePeer(p.a.ID()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err == nil || p.ctx.Err() != nil {
		t.Fatalf("receive after the connection closed: %v (context: %v)", err, p.ctx.Err())
	}
}

// TestUnacceptedDialFallsBackToTheStream: when a dial reaches something
// other than the listener (here a decoy port, as a NAT or a proxy might),
// the listening end says so and the frames go over the stream; that peer
// is not dialed again in the next epoch.
func TestUnacceptedDialFallsBackToTheStream(t *testing.T) {
	decoy, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer decoy.Close()
	go func() {
		for {
			c, err := decoy.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	fallsBackOnce(t, func(_ context.Context, ip net.IP, offer []byte) (net.IP, []byte) {
		o := bytes.Clone(offer)
		binary.BigEndian.PutUint16(o, uint16(decoy.Addr().(*net.TCPAddr).Port))
		return ip, o
	})
}
