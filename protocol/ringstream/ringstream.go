// Package ringstream implements the all-reduce stream protocol
// (/p2ptrain/allreduce/1.3.0): the allreduce.Transport of one ring epoch over
// libp2p streams, whose frames go over a direct link (package directlink)
// where the two peers can reach each other by TCP.
package ringstream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/protocol/directlink"
)

// ID is the all-reduce stream protocol's libp2p protocol ID.
const ID protocol.ID = "/p2ptrain/allreduce/1.3.0"

// The protocol: the opener writes a hello — the epoch number (8 bytes,
// little-endian), the length n of the epoch digest (1 byte, at most
// MaxDigest) and the digest (n bytes) — and a mode byte, then frames
// (allreduce.WriteFrame) in one direction only. Each peer opens one stream
// to each peer it sends to, per epoch, on first use. A stream is delivered
// only to the transport whose number and digest both match, so two rings
// adopted under one number never exchange frames.
//
// Mode 0: the frames follow on the stream. Modes 1 and 2 ask for a direct
// link, negotiated by a directlink.Broker, which the end that accepted the libp2p
// connection listens for: the other end reached that address once, so a
// peer behind a NAT dials out. Answers on the stream are 1 (yes) or 0 (no:
// the frames follow on the stream).
//
// Mode 1 (the receiver accepted the connection): the receiver answers 0,
// or 1 and a directlink offer (the port it listens on at the connection's
// local address, and the key); the opener dials the connection's remote
// address at that port and writes 1 (dialed) or 0 (the dial failed); after
// a 1 the receiver writes 1 (its listener took the connection: the frames
// go over the direct link) or 0 (it did not).
//
// Mode 2 (the opener accepted the connection): the opener's offer follows
// the mode byte; the receiver dials it and writes 1 (dialed) or 0 (it did
// not: direct links off, or a recent failure with this peer); after a 1 the
// opener writes 1 (its listener took the connection) or 0.
//
// The stream stays open beside a direct link, so that a reset or a lost
// connection breaks the link too. An end that saw a link with a peer fail
// neither asks for nor dials one with it for ten minutes.
// Version 1.0.0 had no digest, 1.1.0 no mode byte, 1.2.0 no mode 2.

// MaxDigest is the longest epoch digest a hello may carry.
const MaxDigest = 64

// epochKey names one epoch by number and content.
type epochKey struct {
	number uint64
	digest string
}

const (
	// helloTimeout bounds reading the epoch header of an inbound stream.
	helloTimeout = 10 * time.Second
	// maxPendingStreams bounds inbound streams held for epochs not yet opened.
	maxPendingStreams = 256
	// pendingTTL is how long such a stream waits for its epoch.
	pendingTTL = 30 * time.Second
)

var errTransportClosed = errors.New("ringstream: transport closed")

// Service routes inbound all-reduce streams to the Transport of their epoch.
// Create it with New; Close stops it.
type Service struct {
	host     host.Host
	maxFrame int
	log      *zap.Logger

	notifiee   network.Notifiee
	learnAddrs func(peer.ID)
	// sent counts all-reduce bytes written (frames and their length
	// prefixes), over every epoch; rejected counts the frames the epochs'
	// sessions refused.
	sent, rejected atomic.Uint64
	// links negotiates the streams' direct links.
	links *directlink.Broker

	mu      sync.Mutex
	closed  bool // Close was called: inbound streams are reset
	epochs  map[epochKey]*Transport
	pending []pendingStream
}

type pendingStream struct {
	epoch epochKey
	in    directlink.Inbound
	at    time.Time
}

// New registers the protocol's handler on h. Frames above maxFrame bytes
// are refused; learnAddrs (may be nil) fills in a peer's addresses before
// a stream to it is opened.
func New(h host.Host, maxFrame int, learnAddrs func(peer.ID), log *zap.Logger) *Service {
	rn := &Service{host: h, maxFrame: maxFrame, learnAddrs: learnAddrs, log: log,
		epochs: map[epochKey]*Transport{}, links: directlink.NewBroker(log)}
	h.SetStreamHandler(ID, rn.handle)
	rn.notifiee = &network.NotifyBundle{DisconnectedF: func(nw network.Network, c network.Conn) {
		p := c.RemotePeer()
		if nw.Connectedness(p) == network.Connected {
			return // another connection remains
		}
		rn.mu.Lock()
		ts := make([]*Transport, 0, len(rn.epochs))
		for _, t := range rn.epochs {
			ts = append(ts, t)
		}
		rn.mu.Unlock()
		for _, t := range ts {
			t.peerGone(allreduce.PeerID(p.String()))
		}
	}}
	h.Network().Notify(rn.notifiee)
	return rn
}

// Close removes the handler and resets every open Transport.
func (rn *Service) Close() {
	rn.host.RemoveStreamHandler(ID)
	rn.host.Network().StopNotify(rn.notifiee)
	rn.mu.Lock()
	rn.closed = true
	pend := rn.pending
	rn.pending = nil
	ts := make([]*Transport, 0, len(rn.epochs))
	for _, t := range rn.epochs {
		ts = append(ts, t)
	}
	rn.mu.Unlock()
	for _, p := range pend {
		p.in.Reset()
	}
	for _, t := range ts {
		t.Reset(errTransportClosed)
	}
}

// appendHello appends the stream header naming epoch k.
func appendHello(b []byte, k epochKey) []byte {
	b = binary.LittleEndian.AppendUint64(b, k.number)
	b = append(b, byte(len(k.digest)))
	return append(b, k.digest...)
}

// AppendHello appends a stream hello naming epoch number and digest (at
// most MaxDigest bytes); protocol/pipestream opens its streams with it too.
func AppendHello(b []byte, number uint64, digest string) []byte {
	return appendHello(b, epochKey{number: number, digest: digest})
}

// ReadHello reads a hello written by AppendHello.
func ReadHello(r io.Reader) (number uint64, digest string, err error) {
	k, err := readHello(r)
	return k.number, k.digest, err
}

// readHello reads the stream header written by appendHello.
func readHello(r io.Reader) (epochKey, error) {
	var head [9]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return epochKey{}, fmt.Errorf("read epoch header: %w", err)
	}
	n := int(head[8])
	if n > MaxDigest {
		return epochKey{}, fmt.Errorf("epoch digest of %d bytes exceeds %d", n, MaxDigest)
	}
	digest := make([]byte, n)
	if _, err := io.ReadFull(r, digest); err != nil {
		return epochKey{}, fmt.Errorf("read epoch digest: %w", err)
	}
	return epochKey{number: binary.LittleEndian.Uint64(head[:8]), digest: string(digest)}, nil
}

// SetDirect turns direct links on (the default) or off: off, frames always
// go over the libp2p streams, and a peer asking for a direct link is told
// to send them there.
func (rn *Service) SetDirect(on bool) { rn.links.SetEnabled(on) }

// DirectLinks returns how many direct links this service opened, as
// opener or receiver, over every epoch.
func (rn *Service) DirectLinks() uint64 { return rn.links.Links() }

// receive reads an inbound stream's hello and negotiates its direct link
// (directlink.Broker.Receive).
func (rn *Service) receive(s network.Stream) (epochKey, directlink.Inbound, error) {
	_ = s.SetReadDeadline(time.Now().Add(helloTimeout))
	epoch, err := readHello(s)
	if err != nil {
		return epoch, directlink.Inbound{}, err
	}
	in := directlink.Inbound{Stream: s}
	if in.Link, err = rn.links.Receive(s, rn.maxFrame); err != nil {
		return epoch, in, err
	}
	if in.Link == nil {
		_ = s.SetReadDeadline(time.Time{})
	}
	return epoch, in, nil
}

func (rn *Service) handle(s network.Stream) {
	epoch, in, err := rn.receive(s)
	if err != nil {
		rn.log.Debug("bad all-reduce stream header", zap.Stringer("peer", s.Conn().RemotePeer()), zap.Error(err))
		if in.Link != nil {
			in.Link.Close()
		}
		s.Reset()
		return
	}
	rn.mu.Lock()
	if rn.closed { // closed while this stream negotiated
		rn.mu.Unlock()
		in.Reset()
		return
	}
	t := rn.epochs[epoch]
	if t == nil {
		now := time.Now()
		kept := rn.pending[:0]
		for _, p := range rn.pending {
			if now.Sub(p.at) > pendingTTL {
				p.in.Reset()
				continue
			}
			kept = append(kept, p)
		}
		rn.pending = kept
		if len(rn.pending) >= maxPendingStreams {
			rn.mu.Unlock()
			rn.log.Warn("too many all-reduce streams for unknown epochs; resetting",
				zap.Uint64("epoch", epoch.number), zap.String("digest", epoch.digest))
			in.Reset()
			return
		}
		rn.pending = append(rn.pending, pendingStream{epoch: epoch, in: in, at: now})
		rn.mu.Unlock()
		return
	}
	rn.mu.Unlock()
	t.accept(in)
}

// Open returns the Transport of one epoch, adopting streams that arrived
// early. Close it when the epoch ends normally (after closing the
// allreduce.Session); a failed session resets it.
func (rn *Service) Open(ep allreduce.Ring) *Transport {
	t := &Transport{
		rn:    rn,
		epoch: epochKey{number: ep.Number, digest: ep.Digest},
		peers: map[allreduce.PeerID]bool{},
		out:   map[allreduce.PeerID]*outLink{},
		in:    map[allreduce.PeerID]*inLink{},
		done:  make(chan struct{}),
	}
	for _, p := range ep.Peers {
		t.peers[p] = true
	}
	rn.mu.Lock()
	if old := rn.epochs[t.epoch]; old != nil {
		rn.mu.Unlock()
		old.Reset(fmt.Errorf("ringstream: epoch %d (%s) reopened", ep.Number, ep.Digest))
		rn.mu.Lock()
	}
	rn.epochs[t.epoch] = t
	var early []directlink.Inbound
	kept := rn.pending[:0]
	for _, p := range rn.pending {
		switch {
		case p.epoch == t.epoch:
			early = append(early, p.in)
		case p.epoch.number <= ep.Number:
			// An older epoch, or another ring under this number: neither
			// will open here.
			p.in.Reset()
		default:
			kept = append(kept, p)
		}
	}
	rn.pending = kept
	rn.mu.Unlock()
	for _, in := range early {
		t.accept(in)
	}
	return t
}

func (rn *Service) forget(t *Transport) {
	rn.mu.Lock()
	if rn.epochs[t.epoch] == t {
		delete(rn.epochs, t.epoch)
	}
	rn.mu.Unlock()
}

// Sent returns the all-reduce bytes written successfully, over every epoch.
func (rn *Service) Sent() uint64 { return rn.sent.Load() }

// Rejected returns the frames that all-reduce sessions over this service's
// transports refused (invalid, of another epoch or codec, too large), over
// every epoch.
func (rn *Service) Rejected() uint64 { return rn.rejected.Load() }

// Transport implements allreduce.Transport for one epoch over libp2p streams.
type Transport struct {
	rn    *Service
	epoch epochKey
	peers map[allreduce.PeerID]bool
	// sent counts the bytes this epoch wrote successfully.
	sent atomic.Uint64

	mu   sync.Mutex
	out  map[allreduce.PeerID]*outLink
	in   map[allreduce.PeerID]*inLink
	err  error
	done chan struct{}
}

var (
	_ allreduce.EpochTransport = (*Transport)(nil)
	_ allreduce.FrameRejecter  = (*Transport)(nil)
	_ allreduce.FrameReceiver  = (*Transport)(nil)
)

type outLink struct {
	mu  sync.Mutex
	s   network.Stream
	d   *directlink.Writer // the direct link the frames go over (nil: the stream)
	err error
	buf []byte
}

// reset breaks the stream and the direct link.
func (l *outLink) reset() {
	l.s.Reset() // first: the peer's watcher learns it was a reset
	if l.d != nil {
		l.d.Close()
	}
}

// resetLinger is how long a reset transport's outgoing streams stay closed
// for writing (their last frames readable) before they are reset.
const resetLinger = 5 * time.Second

type inLink struct {
	ready chan struct{} // closed once in is set
	in    directlink.Inbound
	gone  chan struct{} // closed when the peer disconnects before its stream arrived
}

func (t *Transport) closedErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

func (t *Transport) outLink(to allreduce.PeerID) (*outLink, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return nil, t.err
	}
	if !t.peers[to] {
		return nil, fmt.Errorf("ringstream: peer %s is not in epoch %d", to, t.epoch.number)
	}
	l := t.out[to]
	if l == nil {
		l = &outLink{}
		t.out[to] = l
	}
	return l, nil
}

func (t *Transport) inLink(from allreduce.PeerID) (*inLink, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return nil, t.err
	}
	if !t.peers[from] {
		return nil, fmt.Errorf("ringstream: peer %s is not in epoch %d", from, t.epoch.number)
	}
	l := t.in[from]
	if l == nil {
		l = &inLink{ready: make(chan struct{}), gone: make(chan struct{})}
		t.in[from] = l
	}
	return l, nil
}

// accept takes an inbound stream of this epoch.
func (t *Transport) accept(in directlink.Inbound) {
	from := allreduce.PeerID(in.Stream.Conn().RemotePeer().String())
	l, err := t.inLink(from)
	if err != nil {
		t.rn.log.Debug("refusing all-reduce stream", zap.String("peer", string(from)), zap.Error(err))
		in.Reset()
		return
	}
	t.mu.Lock()
	dup := l.in.Stream != nil
	if !dup {
		l.in = in
		close(l.ready)
	}
	t.mu.Unlock()
	if dup {
		t.rn.log.Warn("second all-reduce stream from one peer in one epoch; resetting it",
			zap.String("peer", string(from)), zap.Uint64("epoch", t.epoch.number))
		in.Reset()
	}
}

// Send writes one frame to peer to, opening the stream on first use.
func (t *Transport) Send(ctx context.Context, to allreduce.PeerID, frame []byte) error {
	l, err := t.outLink(to)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if l.s == nil {
		id, err := peer.Decode(string(to))
		if err != nil {
			return fmt.Errorf("ringstream: bad peer ID %q: %w", to, err)
		}
		if t.rn.learnAddrs != nil {
			t.rn.learnAddrs(id)
		}
		s, err := t.rn.host.NewStream(network.WithAllowLimitedConn(ctx, "allreduce"), id, ID)
		if err != nil {
			l.err = fmt.Errorf("ringstream: open all-reduce stream to %s: %w", to, err)
			return l.err
		}
		l.buf = appendHello(l.buf[:0], t.epoch)
		d, err := t.rn.links.Open(ctx, id, s, l.buf)
		if err != nil {
			s.Reset()
			if cerr := ctx.Err(); cerr != nil {
				err = cerr
			}
			l.err = fmt.Errorf("ringstream: all-reduce stream to %s: %w", to, err)
			return l.err
		}
		t.mu.Lock()
		closed := t.err != nil
		if !closed {
			l.s, l.d = s, d
		}
		t.mu.Unlock()
		if closed {
			if d != nil {
				d.Close()
			}
			s.Reset()
			return t.closedErr()
		}
	}
	stop := context.AfterFunc(ctx, l.reset)
	if l.d != nil {
		err = l.d.WriteFrame(frame)
	} else {
		l.buf, err = allreduce.WriteFrame(l.s, frame, l.buf)
	}
	stop()
	if err == nil {
		n := uint64(4 + len(frame))
		t.sent.Add(n)
		t.rn.sent.Add(n)
	}
	if err != nil {
		l.reset()
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		l.err = fmt.Errorf("ringstream: send to %s: %w", to, err)
		return l.err
	}
	return nil
}

// Sent returns the bytes this epoch's Send calls wrote successfully
// (frames and their length prefixes).
func (t *Transport) Sent() uint64 { return t.sent.Load() }

// FrameRejected implements allreduce.FrameRejecter: the session refused a
// frame that came over this transport; the service counts it.
func (t *Transport) FrameRejected(allreduce.PeerID, error) { t.rn.rejected.Add(1) }

// Recv reads the next frame from peer from, waiting for its stream if needed.
func (t *Transport) Recv(ctx context.Context, from allreduce.PeerID) ([]byte, error) {
	return t.RecvInto(ctx, from, func(n int) []byte { return make([]byte, n) })
}

// RecvInto is Recv into the buffer alloc(n) returns for a frame of n bytes
// (allreduce.FrameReceiver: the session recycles frame buffers).
func (t *Transport) RecvInto(ctx context.Context, from allreduce.PeerID, alloc func(n int) []byte) ([]byte, error) {
	l, err := t.inLink(from)
	if err != nil {
		return nil, err
	}
	select {
	case <-l.ready:
	case <-l.gone:
		return nil, fmt.Errorf("ringstream: receive from %s: peer disconnected", from)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.done:
		return nil, t.closedErr()
	}
	in := l.in
	stop := context.AfterFunc(ctx, in.Reset)
	var b []byte
	if in.Link != nil {
		if b, err = in.Link.ReadFrameInto(alloc); errors.Is(err, directlink.ErrFrameTooLarge) {
			err = fmt.Errorf("%w: %w", allreduce.ErrFrameTooLarge, err)
		}
	} else {
		b, err = allreduce.ReadFrameInto(in.Stream, t.rn.maxFrame, alloc)
	}
	stop()
	if err != nil {
		in.Reset()
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		} else if cerr := t.closedErr(); cerr != nil {
			err = cerr
		}
		return nil, fmt.Errorf("ringstream: receive from %s: %w", from, err)
	}
	return b, nil
}

// peerGone wakes a Recv waiting for the stream of a peer that disconnected.
// An established stream fails by itself when its connection closes.
func (t *Transport) peerGone(p allreduce.PeerID) {
	if !t.peers[p] {
		return
	}
	l, err := t.inLink(p)
	if err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-l.gone:
	default:
		if l.in.Stream == nil {
			close(l.gone)
		}
	}
}

// Close ends the epoch gracefully: frames already written still reach their
// peers (outbound streams are half-closed, not reset), so a peer that finished
// its last round does not break a neighbour still reading it. Call it after
// the epoch's allreduce.Session is closed; use Reset after a failure.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.err != nil {
		t.mu.Unlock()
		return nil
	}
	t.err = fmt.Errorf("ringstream: epoch %d transport: %w", t.epoch.number, errTransportClosed)
	close(t.done)
	outs := make([]*outLink, 0, len(t.out))
	for _, l := range t.out {
		outs = append(outs, l)
	}
	var ins []directlink.Inbound
	for _, l := range t.in {
		if l.in.Stream != nil {
			ins = append(ins, l.in)
		}
	}
	t.mu.Unlock()
	// Streams are closed, not only half-closed: only Close (or Reset)
	// gives a stream back to the resource manager, which allows a few per
	// peer and would refuse the streams of later epochs. Close still
	// delivers what was written, on the stream and on a direct link (the
	// kernel sends it); closing a stream also ends its link's watcher,
	// which may have closed the link already (that error is not reported).
	var errs []error
	for _, l := range outs {
		l.mu.Lock() // wait for a write in progress
		if l.d != nil {
			l.d.Close()
		}
		if l.s != nil {
			errs = append(errs, l.s.Close())
		}
		l.mu.Unlock()
	}
	for _, in := range ins {
		if in.Link != nil {
			in.Link.Close()
		}
		errs = append(errs, in.Stream.Close())
	}
	t.rn.forget(t)
	return errors.Join(errs...)
}

// Reset breaks every stream of this epoch; later calls fail with reason.
func (t *Transport) Reset(reason error) {
	if reason == nil {
		reason = errTransportClosed
	}
	t.mu.Lock()
	if t.err != nil {
		t.mu.Unlock()
		return
	}
	t.err = fmt.Errorf("ringstream: epoch %d transport reset: %w", t.epoch.number, reason)
	close(t.done)
	var ins []directlink.Inbound
	for _, l := range t.in {
		if l.in.Stream != nil {
			ins = append(ins, l.in)
		}
	}
	type out struct {
		l *outLink
		s network.Stream // l.s is written under t.mu too
	}
	outs := make([]out, 0, len(t.out))
	for _, l := range t.out {
		if l.s != nil {
			outs = append(outs, out{l, l.s})
		}
	}
	t.mu.Unlock()
	for _, in := range ins {
		in.Reset()
	}
	// An outgoing stream with no write in progress is closed for writing
	// rather than reset: a reset discards frames the peer has not read yet,
	// among them the abort notice that names the culprit, and the peer would
	// blame this one for the broken link. It is reset after resetLinger.
	for _, o := range outs {
		if !o.l.mu.TryLock() {
			o.l.reset() // a write is in progress (perhaps stuck): break it
			continue
		}
		if o.l.d != nil {
			o.l.d.Close() // what was written is still delivered
		}
		if o.s.CloseWrite() != nil {
			o.s.Reset()
		} else {
			time.AfterFunc(resetLinger, func() { o.s.Reset() })
		}
		o.l.mu.Unlock()
	}
	t.rn.forget(t)
}
