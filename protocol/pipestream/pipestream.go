// Package pipestream implements the pipeline stream protocol
// (/p2ptrain/pipe/2): the pipeline.Transport of one peer's stage in one
// pipeline of one ring epoch, over libp2p streams. It carries the
// activations a stage sends to the next stage, the activation gradients
// and the loss it sends to the previous one, the shared token table's
// gradient exchanged between the first and the last stage, and an
// evaluation's activations and held-out figures (docs/pipeline.md). Where
// two stages reach each other by TCP, the frames go over a direct link
// (package directlink), as the all-reduce's do.
package pipestream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/pipeline"
	"github.com/p2ptrain/p2ptrain/protocol/directlink"
	"github.com/p2ptrain/p2ptrain/protocol/ringstream"
)

// ID is the pipeline stream protocol's libp2p protocol ID.
const ID protocol.ID = "/p2ptrain/pipe/2"

// The protocol. A stage opens one stream to each stage it sends to, per
// epoch, on first use, and writes in one direction only: a hello — the
// epoch number (8 bytes, little-endian), the length n of the epoch digest
// (1 byte, at most MaxDigest) and the digest (n bytes), as
// ringstream.AppendHello writes it — and a mode byte with the exchange
// that negotiates a direct link (directlink.Broker; the all-reduce streams'
// modes and answers, docs/protocols.md), then frames, on the stream or, one
// frame per record, on the direct link. Version 1 had no mode byte. A
// frame is a HeaderLen-byte header followed by its payload:
//
//	offset size field
//	0      1    version (Version)
//	1      1    kind (pipeline.Kind: 1 activation, 2 gradient, 3 tied, 4 loss, 5 commit,
//	            6 eval activation, 7 eval stats)
//	2      2    reserved, zero
//	4      4    codec ID (CodecID of the activation codec for kinds 1, 2 and 6;
//	            0 for the others)
//	8      8    epoch number
//	16     8    step
//	24     4    micro-batch (kinds 1, 2), held-out chunk (6) or evaluation
//	            round (7); 0 for the others
//	28     4    payload length
//
// all little-endian. The receiver checks every field against its own
// pipeline before it allocates the payload: the sender must be the stage
// that sends that kind to it, the epoch its own, the codec its own, the
// micro-batch below the step's count (a chunk below the held-out set's, a
// round below its rounds), the length within the kind's bound,
// and the step the one it works on or the next. Any violation fails the
// transport with a *PeerError naming the sender.

// Version is the frame format's version.
const Version = 1

// HeaderLen is the size of a frame header.
const HeaderLen = 32

// MaxDigest is the longest epoch digest a hello may carry.
const MaxDigest = ringstream.MaxDigest

const (
	// helloTimeout bounds reading the hello of an inbound stream.
	helloTimeout = 10 * time.Second
	// pendingTTL is how long an inbound stream waits for its epoch's
	// transport to open.
	pendingTTL = 30 * time.Second
	// maxPending bounds the inbound streams waiting for their transport.
	maxPending = 64
	// openTimeout bounds opening a stream when Pipe.Timeout is 0.
	openTimeout = 30 * time.Second
	// streamEndWait bounds the wait for a stream's end after its direct
	// link's (the two travel on different connections).
	streamEndWait = time.Second
)

// ErrClosed: the transport was closed or reset.
var ErrClosed = errors.New("pipestream: transport closed")

// PeerError is the error of a message exchange that failed because of one
// peer: its link broke, its message was late, or its frame was invalid.
// Err wraps one of package allreduce's sentinels (ErrPeerFailed,
// ErrTimeout, ErrBadFrame, ErrFrameTooLarge, ErrCodecMismatch,
// ErrEpochMismatch), so a trainer classifies failures of both protocols
// alike.
type PeerError struct {
	Peer  string
	Epoch uint64
	Step  uint64
	Err   error
}

// Error implements error.
func (e *PeerError) Error() string {
	return fmt.Sprintf("pipestream: peer %s, epoch %d, step %d: %v", e.Peer, e.Epoch, e.Step, e.Err)
}

// Unwrap returns the underlying error.
func (e *PeerError) Unwrap() error { return e.Err }

// Culprit returns the peer held responsible.
func (e *PeerError) Culprit() string { return e.Peer }

// CodecID identifies an activation codec spec in frame headers: the
// FNV-1a hash of the spec, never 0.
func CodecID(spec string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(spec))
	if id := h.Sum32(); id != 0 {
		return id
	}
	return 1
}

// Pipe is one peer's place in one pipeline of one ring epoch.
type Pipe struct {
	// Epoch and Digest identify the ring epoch (gossip.Epoch's number and
	// Digest); streams and frames of other epochs are refused.
	Epoch  uint64
	Digest string
	// Peers are the pipeline's members in stage order; Self is among them.
	Peers []string
	Self  string
	// Micro is the number of micro-batches per step.
	Micro int
	// Codec is the activation codec's spec, the same on every stage.
	Codec string
	// MaxPayload bounds an activation or gradient payload, TiedBytes is
	// the exact size of a Tied payload (0: the pipeline exchanges none).
	MaxPayload, TiedBytes int
	// EvalChunks is the number of chunks an evaluation cuts the held-out
	// set into (pipeline.EvalChunks; 0: the pipeline does not evaluate,
	// and refuses evaluation frames).
	EvalChunks int
	// Step is the first step the pipeline runs: frames of an earlier step
	// are refused.
	Step uint64
	// Timeout bounds each Recv's wait for its message and each Send's
	// write (0: no bound but the context's).
	Timeout time.Duration
}

func (p Pipe) validate() error {
	switch {
	case len(p.Digest) > MaxDigest:
		return fmt.Errorf("pipestream: epoch digest of %d bytes exceeds %d", len(p.Digest), MaxDigest)
	case len(p.Peers) == 0 || !slices.Contains(p.Peers, p.Self):
		return fmt.Errorf("pipestream: self %s is not in pipeline %v", p.Self, p.Peers)
	case p.Micro < 1:
		return fmt.Errorf("pipestream: %d micro-batches", p.Micro)
	case p.MaxPayload < 0 || p.TiedBytes < 0 || p.EvalChunks < 0 || p.Timeout < 0:
		return fmt.Errorf("pipestream: negative bound (payload %d, tied %d, eval chunks %d, timeout %s)", p.MaxPayload, p.TiedBytes, p.EvalChunks, p.Timeout)
	}
	for i, q := range p.Peers {
		if q == "" || slices.Contains(p.Peers[:i], q) {
			return fmt.Errorf("pipestream: pipeline %v has an empty or repeated member", p.Peers)
		}
	}
	return nil
}

// epochKey names one epoch by number and content.
type epochKey struct {
	number uint64
	digest string
}

// Service routes inbound pipeline streams to the Transport of their epoch.
// Create it with New; Close stops it.
type Service struct {
	host       host.Host
	log        *zap.Logger
	learnAddrs func(peer.ID)
	notifiee   network.Notifiee
	// pending counts inbound streams waiting for their transport.
	pending atomic.Int32
	// sent counts the bytes written over every epoch.
	sent atomic.Uint64
	// links negotiates the streams' direct links.
	links *directlink.Broker

	mu     sync.Mutex
	epochs map[epochKey]*Transport
	// opened is closed (and replaced) whenever a transport opens or the
	// service closes: waiting streams look again.
	opened chan struct{}
	closed bool
}

// New registers the protocol's handler on h. learnAddrs (may be nil) fills
// in a peer's addresses before a stream to it is opened.
func New(h host.Host, learnAddrs func(peer.ID), log *zap.Logger) *Service {
	if log == nil {
		log = zap.NewNop()
	}
	s := &Service{host: h, log: log, learnAddrs: learnAddrs, epochs: map[epochKey]*Transport{}, opened: make(chan struct{}),
		links: directlink.NewBroker(log)}
	h.SetStreamHandler(ID, s.handle)
	s.notifiee = &network.NotifyBundle{DisconnectedF: func(nw network.Network, c network.Conn) {
		p := c.RemotePeer()
		if nw.Connectedness(p) == network.Connected {
			return // another connection remains
		}
		for _, t := range s.transports() {
			t.peerGone(p.String())
		}
	}}
	h.Network().Notify(s.notifiee)
	return s
}

func (s *Service) transports() []*Transport {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := make([]*Transport, 0, len(s.epochs))
	for _, t := range s.epochs {
		ts = append(ts, t)
	}
	return ts
}

// Close removes the handler and resets every open Transport.
func (s *Service) Close() {
	s.host.RemoveStreamHandler(ID)
	s.host.Network().StopNotify(s.notifiee)
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.opened)
	}
	s.mu.Unlock()
	for _, t := range s.transports() {
		t.Reset(ErrClosed)
	}
}

// Sent returns the bytes written over every epoch (hellos, headers and
// payloads).
func (s *Service) Sent() uint64 { return s.sent.Load() }

// SetDirect turns direct links on (the default) or off: off, frames always
// go over the libp2p streams, and a stage asking for a direct link is told
// to send them there.
func (s *Service) SetDirect(on bool) { s.links.SetEnabled(on) }

// DirectLinks returns how many direct links this service opened, as
// sender or receiver, over every epoch.
func (s *Service) DirectLinks() uint64 { return s.links.Links() }

// Open returns the Transport of p, adopting streams that arrived early.
// Close it when the epoch ends normally; Reset it after a failure.
func (s *Service) Open(p Pipe) (*Transport, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	p.Peers = slices.Clone(p.Peers)
	t := &Transport{svc: s, p: p, stage: slices.Index(p.Peers, p.Self), key: epochKey{p.Epoch, p.Digest},
		codecID: CodecID(p.Codec), cur: p.Step, boxes: map[pipeline.Key][]byte{},
		links: map[string]error{}, in: map[string]directlink.Inbound{}, out: map[string]*outLink{},
		changed: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	old := s.epochs[t.key]
	s.epochs[t.key] = t
	close(s.opened)
	s.opened = make(chan struct{})
	s.mu.Unlock()
	if old != nil {
		old.Reset(fmt.Errorf("pipestream: epoch %d (%s) reopened", p.Epoch, p.Digest))
	}
	return t, nil
}

func (s *Service) forget(t *Transport) {
	s.mu.Lock()
	if s.epochs[t.key] == t {
		delete(s.epochs, t.key)
	}
	s.mu.Unlock()
}

// handle reads an inbound stream's hello and hands the stream to its
// epoch's transport, waiting up to pendingTTL for it to open.
func (s *Service) handle(st network.Stream) {
	from := st.Conn().RemotePeer()
	_ = st.SetReadDeadline(time.Now().Add(helloTimeout))
	number, digest, err := ringstream.ReadHello(st)
	key := epochKey{number, digest}
	var d *directlink.Reader
	if err == nil {
		// The frame bound is the transport's, set when it takes the stream.
		d, err = s.links.Receive(st, 0)
	}
	if err != nil {
		s.log.Debug("bad pipeline stream hello", zap.Stringer("peer", from), zap.Error(err))
		if d != nil {
			d.Close()
		}
		st.Reset()
		return
	}
	in := directlink.Inbound{Stream: st, Link: d}
	if d == nil {
		_ = st.SetReadDeadline(time.Time{})
	}
	if s.pending.Add(1) > maxPending {
		s.pending.Add(-1)
		s.log.Warn("too many pipeline streams waiting for their epoch; resetting", zap.Stringer("peer", from), zap.Uint64("epoch", key.number))
		in.Reset()
		return
	}
	defer s.pending.Add(-1)
	expire := time.NewTimer(pendingTTL)
	defer expire.Stop()
	for {
		s.mu.Lock()
		t, closed, opened := s.epochs[key], s.closed, s.opened
		s.mu.Unlock()
		switch {
		case t != nil:
			t.accept(from.String(), in)
			return
		case closed:
			in.Reset()
			return
		}
		select {
		case <-opened:
		case <-expire.C:
			s.log.Debug("pipeline stream for an epoch that never opened here", zap.Stringer("peer", from), zap.Uint64("epoch", key.number))
			in.Reset()
			return
		}
	}
}

// Transport implements pipeline.Transport for one stage of one pipeline
// in one epoch over libp2p streams. Messages received are buffered until
// Recv takes them, so a sender never waits for the receiver's schedule;
// what can be buffered is bounded by the pipeline (two steps of at most
// Micro messages per kind and sender, each at most Pipe.MaxPayload; an
// evaluation's window of two rounds of Micro chunks).
type Transport struct {
	svc     *Service
	p       Pipe
	stage   int
	key     epochKey
	codecID uint32
	sent    atomic.Uint64
	recvd   atomic.Uint64
	readers sync.WaitGroup

	mu sync.Mutex
	// cur is the step the stage works on: frames of steps cur and cur+1
	// are accepted.
	cur   uint64
	boxes map[pipeline.Key][]byte
	// links holds, per sender, why its link is gone (nil: not gone).
	links map[string]error
	in    map[string]directlink.Inbound
	out   map[string]*outLink
	// opened are the outbound streams, reset by Reset without waiting for
	// a write in progress (which resets their direct links too).
	opened []network.Stream
	// err fails every call once set (Close, Reset, a bad frame).
	err error
	// changed is closed (and replaced) on every delivery and failure.
	changed chan struct{}
}

var _ pipeline.Transport = (*Transport)(nil)

type outLink struct {
	mu  sync.Mutex
	s   network.Stream
	d   *directlink.Writer // the direct link the frames go over (nil: the stream)
	err error
	buf []byte
}

// maxFrame returns the largest frame any stage may send this one: a header
// and the largest payload of any kind.
func (t *Transport) maxFrame() int {
	most := 0
	for _, k := range pipeline.Kinds() {
		_, limit, _ := t.bound(k)
		most = max(most, limit)
	}
	return HeaderLen + most
}

// Stage returns this peer's stage in the pipeline.
func (t *Transport) Stage() int { return t.stage }

// Sent and Received return the frame bytes (headers and payloads) this
// transport wrote and read.
func (t *Transport) Sent() uint64     { return t.sent.Load() }
func (t *Transport) Received() uint64 { return t.recvd.Load() }

// peerOf returns the member at stage s.
func (t *Transport) peerOf(s int) string { return t.p.Peers[s] }

// notify wakes every waiting Recv. Callers hold t.mu.
func (t *Transport) notify() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// sends reports whether stage from sends messages of some kind to this stage.
func (t *Transport) sends(from int) bool {
	for _, k := range pipeline.Kinds() {
		if s, err := pipeline.Source(k, t.stage, len(t.p.Peers)); err == nil && s == from {
			return true
		}
	}
	return false
}

// accept takes an inbound stream from peer from and starts its reader.
func (t *Transport) accept(from string, in directlink.Inbound) {
	s := slices.Index(t.p.Peers, from)
	t.mu.Lock()
	refuse := ""
	switch {
	case t.err != nil:
		refuse = "transport closed"
	case s < 0 || !t.sends(s):
		refuse = "not a stage that sends to this one"
	case t.in[from].Stream != nil:
		refuse = "second stream in one epoch"
	default:
		t.in[from] = in
		t.readers.Add(1)
	}
	t.mu.Unlock()
	if refuse != "" {
		t.svc.log.Debug("refusing pipeline stream", zap.String("peer", from), zap.Uint64("epoch", t.p.Epoch), zap.String("why", refuse))
		in.Reset()
		return
	}
	go func() {
		defer t.readers.Done()
		if in.Link != nil {
			in.Link.SetMaxFrame(t.maxFrame())
			t.readLink(from, s, in.Link)
			return
		}
		t.read(from, s, in.Stream)
	}()
}

// read receives frames from stage s (peer from) until the stream ends or
// a frame is refused.
func (t *Transport) read(from string, s int, st network.Stream) {
	var h [HeaderLen]byte
	for {
		if _, err := io.ReadFull(st, h[:]); err != nil {
			t.linkGone(from, err)
			return
		}
		k, n, err := t.check(s, h[:])
		if err != nil {
			t.fail(&PeerError{Peer: from, Epoch: t.p.Epoch, Step: k.Step, Err: err})
			return
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(st, payload); err != nil {
			t.linkGone(from, err)
			return
		}
		if !t.deliver(from, k, payload, uint64(HeaderLen+n)) {
			return
		}
	}
}

// readLink receives frames from stage s (peer from) over a direct link,
// one frame per record, until the link ends or a frame is refused.
func (t *Transport) readLink(from string, s int, d *directlink.Reader) {
	for {
		rec, err := d.ReadFrameInto(func(n int) []byte { return make([]byte, n, n+directlink.Overhead) }) // opened in place
		switch {
		case errors.Is(err, directlink.ErrFrameTooLarge):
			t.fail(&PeerError{Peer: from, Epoch: t.p.Epoch, Err: fmt.Errorf("%w: %w", allreduce.ErrFrameTooLarge, err)})
			return
		case errors.Is(err, directlink.ErrBadRecord):
			t.fail(&PeerError{Peer: from, Epoch: t.p.Epoch, Err: fmt.Errorf("%w: %w", allreduce.ErrBadFrame, err)})
			return
		}
		if err != nil {
			// The link's end alone does not say whether the stage closed
			// its epoch or reset it (its step failed): the stream does.
			if ended, serr := d.StreamEnd(streamEndWait); ended && serr != nil {
				err = serr
			}
			t.linkGone(from, err)
			return
		}
		if len(rec) < HeaderLen {
			t.fail(&PeerError{Peer: from, Epoch: t.p.Epoch, Err: fmt.Errorf("%w: a record of %d bytes holds no frame header", allreduce.ErrBadFrame, len(rec))})
			return
		}
		k, n, err := t.check(s, rec[:HeaderLen])
		if err == nil && n != len(rec)-HeaderLen {
			err = fmt.Errorf("%w: header says %d payload bytes, the record holds %d", allreduce.ErrBadFrame, n, len(rec)-HeaderLen)
		}
		if err != nil {
			t.fail(&PeerError{Peer: from, Epoch: t.p.Epoch, Step: k.Step, Err: err})
			return
		}
		if !t.deliver(from, k, rec[HeaderLen:], uint64(len(rec))) {
			return
		}
	}
}

// deliver boxes the payload of message k from peer from (n frame bytes);
// false when the transport failed (a duplicate fails it).
func (t *Transport) deliver(from string, k pipeline.Key, payload []byte, n uint64) bool {
	t.recvd.Add(n)
	t.mu.Lock()
	_, dup := t.boxes[k]
	if !dup && t.err == nil {
		t.boxes[k] = payload
		t.notify()
	}
	t.mu.Unlock()
	if dup {
		t.fail(&PeerError{Peer: from, Epoch: t.p.Epoch, Step: k.Step, Err: fmt.Errorf("%w: %v sent twice", allreduce.ErrBadFrame, k)})
		return false
	}
	return true
}

// check validates a frame header from stage s and returns its key and
// payload length.
func (t *Transport) check(s int, h []byte) (pipeline.Key, int, error) {
	kind := pipeline.Kind(h[1])
	codec := binary.LittleEndian.Uint32(h[4:])
	epoch := binary.LittleEndian.Uint64(h[8:])
	k := pipeline.Key{Step: binary.LittleEndian.Uint64(h[16:]), Kind: kind}
	micro := binary.LittleEndian.Uint32(h[24:])
	n := int64(binary.LittleEndian.Uint32(h[28:]))
	if h[0] != Version || h[2] != 0 || h[3] != 0 {
		return k, 0, fmt.Errorf("%w: frame version %d (this build reads %d) or reserved bytes set", allreduce.ErrBadFrame, h[0], Version)
	}
	if epoch != t.p.Epoch {
		return k, 0, fmt.Errorf("%w: frame of epoch %d in epoch %d", allreduce.ErrEpochMismatch, epoch, t.p.Epoch)
	}
	if src, err := pipeline.Source(kind, t.stage, len(t.p.Peers)); err != nil || src != s {
		return k, 0, fmt.Errorf("%w: stage %d sent a %v frame to stage %d", allreduce.ErrBadFrame, s, kind, t.stage)
	}
	wantCodec, limit, exact := t.bound(kind)
	maxLen := int64(limit)
	if codec != wantCodec {
		return k, 0, fmt.Errorf("%w: %v frame of codec %#x, want %#x (train.activation_codec %q)", allreduce.ErrCodecMismatch, kind, codec, wantCodec, t.p.Codec)
	}
	if bound := t.micros(kind); micro >= uint32(bound) {
		if bound == 1 {
			return k, 0, fmt.Errorf("%w: %v frame names micro-batch %d", allreduce.ErrBadFrame, kind, micro)
		}
		return k, 0, fmt.Errorf("%w: %v frame names micro-batch, chunk or round %d of %d", allreduce.ErrBadFrame, kind, micro, bound)
	}
	k.Micro = int(micro)
	if n > maxLen || (exact && n != maxLen) {
		return k, 0, fmt.Errorf("%w: %v payload of %d bytes, at most %d", allreduce.ErrFrameTooLarge, kind, n, maxLen)
	}
	t.mu.Lock()
	cur := t.cur
	t.mu.Unlock()
	if k.Step < cur || k.Step > cur+1 {
		return k, 0, fmt.Errorf("%w: %v of step %d while this stage works on step %d", allreduce.ErrBadFrame, k, k.Step, cur)
	}
	return k, int(n), nil
}

// linkError classifies a broken stream to a peer: a reset from its side
// is an abort (allreduce.ErrAborted: its step failed, the peer is not to
// blame for this one), anything else a failure of the peer or its link.
func linkError(err error) error {
	var se *network.StreamError
	switch {
	case errors.As(err, &se) && se.Remote:
		return fmt.Errorf("%w: it reset its link (its step failed, or it stopped): %v", allreduce.ErrAborted, err)
	case errors.Is(err, io.EOF):
		return fmt.Errorf("%w: it closed its link", allreduce.ErrPeerFailed)
	}
	return fmt.Errorf("%w: its link broke: %v", allreduce.ErrPeerFailed, err)
}

// linkGone records that the stream from peer from ended.
func (t *Transport) linkGone(from string, err error) {
	why := linkError(err)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.links[from] == nil {
		t.links[from] = why
		t.notify()
	}
}

// peerGone records that peer p disconnected. A stream from it fails by
// itself; this wakes a Recv waiting for a stream that never came.
func (t *Transport) peerGone(p string) {
	if !slices.Contains(t.p.Peers, p) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.in[p].Stream == nil && t.links[p] == nil {
		t.links[p] = fmt.Errorf("%w: it disconnected", allreduce.ErrPeerFailed)
		t.notify()
	}
}

// Send implements pipeline.Transport: it writes message k to the stage
// that takes it, opening the stream on first use.
func (t *Transport) Send(ctx context.Context, k pipeline.Key, payload []byte) error {
	s, err := pipeline.Dest(k.Kind, t.stage, len(t.p.Peers))
	if err != nil {
		return err
	}
	to := t.peerOf(s)
	codec, limit, _ := t.bound(k.Kind)
	if micros := t.micros(k.Kind); len(payload) > limit || k.Micro < 0 || k.Micro >= micros {
		return fmt.Errorf("pipestream: %v of %d bytes to %s exceeds the pipeline's bound of %d bytes or of %d micro-batches, chunks or rounds", k, len(payload), to, limit, micros)
	}
	l, err := t.outLink(to)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	fail := func(err error) error {
		if cerr := context.Cause(ctx); cerr != nil {
			err = cerr
		}
		l.err = &PeerError{Peer: to, Epoch: t.p.Epoch, Step: k.Step, Err: fmt.Errorf("sending %v: %w", k, linkError(err))}
		return l.err
	}
	if l.s == nil {
		st, d, err := t.open(ctx, to)
		if err != nil {
			return fail(err)
		}
		l.s, l.d = st, d
	}
	l.buf = appendFrame(l.buf[:0], k, codec, t.p.Epoch, payload)
	reset := func() {
		l.s.Reset() // first: the peer's watcher learns it was a reset
		if l.d != nil {
			l.d.Close()
		}
	}
	if t.p.Timeout > 0 {
		deadline := time.Now().Add(t.p.Timeout)
		_ = l.s.SetWriteDeadline(deadline)
		if l.d != nil {
			_ = l.d.SetWriteDeadline(deadline)
		}
	}
	stop := context.AfterFunc(ctx, reset)
	if l.d != nil {
		err = l.d.WriteFrame(l.buf)
	} else {
		_, err = l.s.Write(l.buf)
	}
	stop()
	if err != nil {
		// A link's failure alone does not say whether the stage reset its
		// epoch (its step failed) or broke: the stream does.
		if l.d != nil && ctx.Err() == nil {
			if ended, serr := l.d.StreamEnd(streamEndWait); ended && serr != nil {
				err = serr
			}
		}
		reset()
		return fail(err)
	}
	t.sent.Add(uint64(len(l.buf)))
	t.svc.sent.Add(uint64(len(l.buf)))
	// The muxer hands the frame to its send loop, another goroutine. Where
	// the stage's compute holds every P (one core: GOMAXPROCS = 1), that
	// goroutine would run only when the stage next waits, and the message
	// would leave a forward or backward pass late: yield so it leaves now.
	runtime.Gosched()
	return nil
}

// bound returns the codec ID and the payload bound of messages of kind k,
// and whether the payload must have exactly that size.
func (t *Transport) bound(k pipeline.Kind) (codec uint32, limit int, exact bool) {
	switch k {
	case pipeline.Tied:
		return 0, t.p.TiedBytes, true
	case pipeline.Loss:
		return 0, pipeline.LossBytes, true
	case pipeline.Commit:
		return 0, pipeline.CommitBytes, true
	case pipeline.EvalStats:
		return 0, pipeline.EvalStatsBytes, true
	}
	return t.codecID, t.p.MaxPayload, false
}

// micros returns the bound on the micro-batch field of kind k's frames:
// the micro-batches of a step (activations and gradients), the held-out
// set's chunks (eval activations) or an evaluation's rounds (eval stats),
// and 1 (the field is 0) for the others.
func (t *Transport) micros(k pipeline.Kind) int {
	switch k {
	case pipeline.Activation, pipeline.Gradient:
		return t.p.Micro
	case pipeline.EvalActivation:
		return t.p.EvalChunks
	case pipeline.EvalStats:
		return pipeline.EvalRounds(t.p.EvalChunks, t.p.Micro)
	}
	return 1
}

// appendFrame appends message k's frame: its header and payload.
func appendFrame(b []byte, k pipeline.Key, codec uint32, epoch uint64, payload []byte) []byte {
	b = append(b, Version, byte(k.Kind), 0, 0)
	b = binary.LittleEndian.AppendUint32(b, codec)
	b = binary.LittleEndian.AppendUint64(b, epoch)
	b = binary.LittleEndian.AppendUint64(b, k.Step)
	b = binary.LittleEndian.AppendUint32(b, uint32(k.Micro)) // Send checked it against the kind's bound
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// open opens the stream to peer to, writes the hello and negotiates the
// direct link (nil: the frames go on the stream).
func (t *Transport) open(ctx context.Context, to string) (network.Stream, *directlink.Writer, error) {
	id, err := peer.Decode(to)
	if err != nil {
		return nil, nil, fmt.Errorf("bad peer ID %q: %w", to, err)
	}
	if t.svc.learnAddrs != nil {
		t.svc.learnAddrs(id)
	}
	d := t.p.Timeout
	if d <= 0 {
		d = openTimeout
	}
	octx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	st, err := t.svc.host.NewStream(network.WithAllowLimitedConn(octx, "pipeline"), id, ID)
	if err != nil {
		return nil, nil, fmt.Errorf("open pipeline stream: %w", err)
	}
	hello := ringstream.AppendHello(nil, t.key.number, t.key.digest)
	link, err := t.svc.links.Open(octx, id, st, hello)
	if err != nil {
		st.Reset()
		return nil, nil, fmt.Errorf("pipeline stream hello: %w", err)
	}
	t.mu.Lock()
	closed := t.err
	if closed == nil {
		t.opened = append(t.opened, st)
	}
	t.mu.Unlock()
	if closed != nil {
		if link != nil {
			link.Close()
		}
		st.Reset()
		return nil, nil, closed
	}
	t.sent.Add(uint64(len(hello)))
	t.svc.sent.Add(uint64(len(hello)))
	return st, link, nil
}

func (t *Transport) outLink(to string) (*outLink, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return nil, t.err
	}
	l := t.out[to]
	if l == nil {
		l = &outLink{}
		t.out[to] = l
	}
	return l, nil
}

// Recv implements pipeline.Transport: it returns message k's payload,
// waiting for it until ctx ends or Pipe.Timeout passes. A Recv of step k
// moves the transport to step k: frames of earlier steps are refused from
// then on.
func (t *Transport) Recv(ctx context.Context, k pipeline.Key) ([]byte, error) {
	s, err := pipeline.Source(k.Kind, t.stage, len(t.p.Peers))
	if err != nil {
		return nil, err
	}
	from := t.peerOf(s)
	var expire <-chan time.Time
	if t.p.Timeout > 0 {
		tm := time.NewTimer(t.p.Timeout)
		defer tm.Stop()
		expire = tm.C
	}
	for {
		t.mu.Lock()
		if k.Step > t.cur {
			t.cur = k.Step
			for old := range t.boxes { // none in a correct pipeline
				if old.Step < t.cur {
					delete(t.boxes, old)
				}
			}
		}
		p, ok := t.boxes[k]
		if ok {
			delete(t.boxes, k)
		}
		err, gone, changed := t.err, t.links[from], t.changed
		t.mu.Unlock()
		switch {
		case ok:
			return p, nil
		case err != nil:
			return nil, err
		case gone != nil:
			return nil, &PeerError{Peer: from, Epoch: t.p.Epoch, Step: k.Step, Err: fmt.Errorf("waiting for %v: %w", k, gone)}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("pipestream: waiting for %v from %s: %w", k, from, context.Cause(ctx))
		case <-expire:
			return nil, &PeerError{Peer: from, Epoch: t.p.Epoch, Step: k.Step, Err: fmt.Errorf("%w: no %v within %s", allreduce.ErrTimeout, k, t.p.Timeout)}
		}
	}
}

// Close ends the epoch gracefully: frames already written still reach
// their stages (outbound streams are closed for writing, not reset). It
// returns once the transport's readers stopped.
func (t *Transport) Close() error {
	err := t.end(ErrClosed, false)
	t.readers.Wait()
	return err
}

// Reset breaks every stream of the transport; later calls fail with
// reason, and the stages it talks to fail promptly. It returns once the
// transport's readers stopped.
func (t *Transport) Reset(reason error) {
	if reason == nil {
		reason = ErrClosed
	}
	_ = t.end(reason, true)
	t.readers.Wait()
}

// fail fails the transport with err (a reader found a bad frame) and
// resets its streams, so that the neighbours fail promptly too.
func (t *Transport) fail(err error) {
	t.svc.log.Warn("pipeline transport failed", zap.Uint64("epoch", t.p.Epoch), zap.Error(err))
	_ = t.end(err, true)
}

// end sets the transport's error and closes (reset: resets) its streams.
func (t *Transport) end(reason error, reset bool) error {
	t.mu.Lock()
	if t.err != nil {
		t.mu.Unlock()
		return nil
	}
	t.err = reason
	t.notify()
	ins := make([]directlink.Inbound, 0, len(t.in))
	for _, in := range t.in {
		ins = append(ins, in)
	}
	outs := make([]*outLink, 0, len(t.out))
	for _, l := range t.out {
		outs = append(outs, l)
	}
	opened := t.opened
	t.mu.Unlock()
	t.svc.forget(t)
	if reset {
		for _, in := range ins {
			in.Reset()
		}
		for _, st := range opened {
			st.Reset() // its direct link's watcher closes the link
		}
		return nil
	}
	// Close, not only CloseRead or CloseWrite: only Close (or Reset)
	// gives a stream back to the resource manager, which would refuse new
	// streams after a few epochs. What was written is still delivered.
	var errs []error
	for _, in := range ins {
		if in.Link != nil {
			in.Link.Close()
		}
		errs = append(errs, in.Stream.Close())
	}
	for _, l := range outs {
		l.mu.Lock() // wait for a write in progress
		if l.d != nil {
			l.d.Close() // what was written is still delivered
		}
		if l.s != nil {
			errs = append(errs, l.s.Close())
		}
		if l.err == nil {
			l.err = reason
		}
		l.mu.Unlock()
	}
	return errors.Join(errs...)
}
