// Package ringstream implements the all-reduce stream protocol
// (/p2ptrain/allreduce/1.1.0): the allreduce.Transport of one ring epoch over
// libp2p streams.
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
)

// ID is the all-reduce stream protocol's libp2p protocol ID.
const ID protocol.ID = "/p2ptrain/allreduce/1.1.0"

// The protocol: the opener writes a hello — the epoch number (8 bytes,
// little-endian), the length n of the epoch digest (1 byte, at most
// MaxDigest) and the digest (n bytes) — then frames (allreduce.WriteFrame)
// in one direction only. Each peer opens one stream to each peer it sends
// to, per epoch, on first use. A stream is delivered only to the transport
// whose number and digest both match, so two rings adopted under one number
// never exchange frames. Version 1.0.0 had no digest.

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

	mu      sync.Mutex
	epochs  map[epochKey]*Transport
	pending []pendingStream
}

type pendingStream struct {
	epoch epochKey
	s     network.Stream
	at    time.Time
}

// New registers the protocol's handler on h. Frames above maxFrame bytes
// are refused; learnAddrs (may be nil) fills in a peer's addresses before
// a stream to it is opened.
func New(h host.Host, maxFrame int, learnAddrs func(peer.ID), log *zap.Logger) *Service {
	rn := &Service{host: h, maxFrame: maxFrame, learnAddrs: learnAddrs, log: log, epochs: map[epochKey]*Transport{}}
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
	pend := rn.pending
	rn.pending = nil
	ts := make([]*Transport, 0, len(rn.epochs))
	for _, t := range rn.epochs {
		ts = append(ts, t)
	}
	rn.mu.Unlock()
	for _, p := range pend {
		p.s.Reset()
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

func (rn *Service) handle(s network.Stream) {
	_ = s.SetReadDeadline(time.Now().Add(helloTimeout))
	epoch, err := readHello(s)
	if err != nil {
		rn.log.Debug("bad all-reduce stream header", zap.Stringer("peer", s.Conn().RemotePeer()), zap.Error(err))
		s.Reset()
		return
	}
	_ = s.SetReadDeadline(time.Time{})
	rn.mu.Lock()
	t := rn.epochs[epoch]
	if t == nil {
		now := time.Now()
		kept := rn.pending[:0]
		for _, p := range rn.pending {
			if now.Sub(p.at) > pendingTTL {
				p.s.Reset()
				continue
			}
			kept = append(kept, p)
		}
		rn.pending = kept
		if len(rn.pending) >= maxPendingStreams {
			rn.mu.Unlock()
			rn.log.Warn("too many all-reduce streams for unknown epochs; resetting",
				zap.Uint64("epoch", epoch.number), zap.String("digest", epoch.digest))
			s.Reset()
			return
		}
		rn.pending = append(rn.pending, pendingStream{epoch: epoch, s: s, at: now})
		rn.mu.Unlock()
		return
	}
	rn.mu.Unlock()
	t.accept(s)
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
	var early []network.Stream
	kept := rn.pending[:0]
	for _, p := range rn.pending {
		switch {
		case p.epoch == t.epoch:
			early = append(early, p.s)
		case p.epoch.number <= ep.Number:
			// An older epoch, or another ring under this number: neither
			// will open here.
			p.s.Reset()
		default:
			kept = append(kept, p)
		}
	}
	rn.pending = kept
	rn.mu.Unlock()
	for _, s := range early {
		t.accept(s)
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
	err error
	buf []byte
}

// resetLinger is how long a reset transport's outgoing streams stay closed
// for writing (their last frames readable) before they are reset.
const resetLinger = 5 * time.Second

type inLink struct {
	ready chan struct{} // closed once s is set
	s     network.Stream
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
func (t *Transport) accept(s network.Stream) {
	from := allreduce.PeerID(s.Conn().RemotePeer().String())
	l, err := t.inLink(from)
	if err != nil {
		t.rn.log.Debug("refusing all-reduce stream", zap.String("peer", string(from)), zap.Error(err))
		s.Reset()
		return
	}
	t.mu.Lock()
	dup := l.s != nil
	if !dup {
		l.s = s
		close(l.ready)
	}
	t.mu.Unlock()
	if dup {
		t.rn.log.Warn("second all-reduce stream from one peer in one epoch; resetting it",
			zap.String("peer", string(from)), zap.Uint64("epoch", t.epoch.number))
		s.Reset()
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
		if _, err := s.Write(l.buf); err != nil {
			s.Reset()
			l.err = fmt.Errorf("ringstream: all-reduce stream to %s: %w", to, err)
			return l.err
		}
		t.mu.Lock()
		closed := t.err != nil
		if !closed {
			l.s = s
		}
		t.mu.Unlock()
		if closed {
			s.Reset()
			return t.closedErr()
		}
	}
	stop := context.AfterFunc(ctx, func() { l.s.Reset() })
	l.buf, err = allreduce.WriteFrame(l.s, frame, l.buf)
	stop()
	if err == nil {
		n := uint64(4 + len(frame))
		t.sent.Add(n)
		t.rn.sent.Add(n)
	}
	if err != nil {
		l.s.Reset()
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
	stop := context.AfterFunc(ctx, func() { l.s.Reset() })
	b, err := allreduce.ReadFrameInto(l.s, t.rn.maxFrame, alloc)
	stop()
	if err != nil {
		l.s.Reset()
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
		if l.s == nil {
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
	var ins []network.Stream
	for _, l := range t.in {
		if l.s != nil {
			ins = append(ins, l.s)
		}
	}
	t.mu.Unlock()
	var errs []error
	for _, l := range outs {
		l.mu.Lock() // wait for a write in progress
		if l.s != nil {
			errs = append(errs, l.s.CloseWrite())
		}
		l.mu.Unlock()
	}
	for _, s := range ins {
		errs = append(errs, s.CloseRead())
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
	var streams []network.Stream
	for _, l := range t.in {
		if l.s != nil {
			streams = append(streams, l.s)
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
	for _, s := range streams {
		s.Reset()
	}
	// An outgoing stream with no write in progress is closed for writing
	// rather than reset: a reset discards frames the peer has not read yet,
	// among them the abort notice that names the culprit, and the peer would
	// blame this one for the broken link. It is reset after resetLinger.
	for _, o := range outs {
		if !o.l.mu.TryLock() {
			o.s.Reset() // a write is in progress (perhaps stuck): break it
			continue
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
