package allreduce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// abortTimeout bounds the best-effort delivery of abort notices.
const abortTimeout = 2 * time.Second

// flushTimeout bounds how long Close waits for queued frames to be sent.
const flushTimeout = 10 * time.Second

// sendFailGrace is how long a failed Send waits for the peer's reader to
// report the failure (with the culprit an abort notice names) before
// reporting it itself.
const sendFailGrace = time.Second

// Session runs all-reduce rounds for one peer in one ring epoch over one
// Transport. It starts one reader and one writer goroutine per other peer;
// Close stops them.
//
// Any failure (a broken link, a late or invalid frame, a canceled context,
// an invalid bucket) fails the whole Session: every round in flight and every
// later round returns the same *PeerError, the Session tells the other peers
// (an abort frame naming the culprit) and resets its Transport so they fail
// fast too. A failed Session cannot be reused; the caller retries the step in
// the next epoch with a new Session.
type Session struct {
	ep   Ring
	rank int
	w    int
	t    Transport
	cfg  Config
	log  *zap.Logger
	max  int

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}

	mu    sync.Mutex
	boxes map[boxKey]*mailbox
	// buffered counts, per rank, the frame bytes held in mailboxes and not
	// yet consumed (bounded by Config.MaxBufferedBytes).
	buffered []int
	// round is the step of the latest local round; rounds says one exists.
	// Frames for other steps than round and round+1 are refused.
	round  uint64
	rounds bool
	// ended marks peers (by rank) that closed the epoch cleanly.
	ended map[int]bool
	err   error
	done  chan struct{}
	// aborted is closed when the abort notices of a failed session went
	// out (or abortTimeout passed); Close waits for it before cancelling.
	aborted chan struct{}
	out     []*outQueue
	// floats recycles the rounds' scratch buffers; frames recycles frame
	// buffers (see handOff and op.release).
	floats floatPool
	frames framePool
	// hier is the group structure of a hierarchical schedule (nil otherwise).
	hier *hierGroups
	// queued counts the bytes of the frames the rounds queued for sending.
	queued atomic.Uint64
}

type boxKey struct {
	from   int
	step   uint64
	bucket uint32
	phase  Phase
}

type frameMsg struct {
	h       Header
	payload []byte
	raw     []byte
}

type mailbox struct {
	q     []frameMsg
	ready chan struct{}
}

type outQueue struct {
	mu    sync.Mutex
	q     []outFrame
	ready chan struct{}
	// busy is set while the writer sends a frame it took from q.
	busy bool
	// idle is signalled (under mu) whenever q is empty and nothing is in flight.
	idle *sync.Cond
}

// outFrame is a queued frame; the writer recycles it after sending when
// recycle is set (Session.handOff).
type outFrame struct {
	b       []byte
	recycle bool
}

// drained reports whether every queued frame was handed to the Transport. Callers hold q.mu.
func (q *outQueue) drained() bool { return len(q.q) == 0 && !q.busy }

// NewSession starts a session for epoch ep over transport t.
func NewSession(ep Ring, t Transport, cfg Config) (*Session, error) {
	if err := ep.validate(); err != nil {
		return nil, err
	}
	if t == nil && len(ep.Peers) > 1 {
		return nil, fmt.Errorf("%w: nil transport", ErrConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.Robust.validate(); err != nil {
		return nil, err
	}
	if cfg.Shares != nil {
		if err := checkShares(cfg.Shares, len(ep.Peers)); err != nil {
			return nil, err
		}
	}
	if _, err := ParseSchedule(string(cfg.Schedule)); err != nil {
		return nil, err
	}
	var hier *hierGroups
	if cfg.Schedule.Hierarchical() {
		g, err := cfg.Schedule.Groups(len(ep.Peers))
		if err != nil {
			return nil, err
		}
		hier = newHierGroups(g, ep.Rank(ep.Self))
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Session{
		ep:       ep,
		rank:     ep.Rank(ep.Self),
		w:        len(ep.Peers),
		t:        t,
		cfg:      cfg,
		log:      cfg.Logger.Named("allreduce").With(zap.Uint64("epoch", ep.Number), zap.String("self", string(ep.Self))),
		max:      cfg.MaxFrameBytes,
		ctx:      ctx,
		cancel:   cancel,
		sem:      make(chan struct{}, cfg.Concurrency),
		boxes:    make(map[boxKey]*mailbox),
		buffered: make([]int, len(ep.Peers)),
		ended:    make(map[int]bool),
		done:     make(chan struct{}),
		out:      make([]*outQueue, len(ep.Peers)),
		hier:     hier,
	}
	// Every queue exists before any goroutine starts: a reader that fails at
	// once calls fail → wakeFlush, which walks all of s.out.
	for i := range ep.Peers {
		if i == s.rank {
			continue
		}
		q := &outQueue{ready: make(chan struct{}, 1)}
		q.idle = sync.NewCond(&q.mu)
		s.out[i] = q
	}
	s.wg.Add(2 * (len(ep.Peers) - 1))
	for i := range ep.Peers {
		if i == s.rank {
			continue
		}
		go s.readLoop(i)
		go s.writeLoop(i)
	}
	return s, nil
}

// Queued returns the bytes of the frames this session's rounds queued for
// their neighbours so far. A round's frames are counted when queued, so the
// difference across a step is that step's traffic even though Round.Wait
// may return before the writers handed its last frames to the Transport
// (whose byte count would then name them in the next step).
func (s *Session) Queued() uint64 { return s.queued.Load() }

// Ring returns the session's ring epoch.
func (s *Session) Ring() Ring { return s.ep }

// Err returns the error that failed the session, or nil.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close stops the session's goroutines and waits for them. Rounds still in
// flight fail with ErrClosed (or the session's earlier failure). Close does
// not reset the Transport unless the session had failed; it is idempotent.
func (s *Session) Close() error {
	s.flush()
	s.mu.Lock()
	if s.err == nil {
		s.err = fmt.Errorf("%w (epoch %d)", ErrClosed, s.ep.Number)
		close(s.done)
	}
	aborted := s.aborted
	s.mu.Unlock()
	if aborted != nil {
		<-aborted // the abort notices go out before the session's streams are cut
	}
	s.cancel()
	s.wg.Wait()
	return nil
}

// flush waits (at most flushTimeout) until every frame queued by finished
// rounds was handed to the Transport, so that closing a healthy session never
// drops the last frames a neighbour still needs. A failed session is not flushed.
func (s *Session) flush() {
	if s.errNow() != nil {
		return
	}
	deadline := time.AfterFunc(flushTimeout, func() {
		for _, q := range s.out {
			if q == nil {
				continue
			}
			q.mu.Lock()
			q.busy, q.q = false, nil // give up: wake the waiters below
			q.idle.Broadcast()
			q.mu.Unlock()
		}
	})
	defer deadline.Stop()
	for _, q := range s.out {
		if q == nil {
			continue
		}
		q.mu.Lock()
		for !q.drained() && s.errNow() == nil {
			q.idle.Wait()
		}
		q.mu.Unlock()
	}
}

// wakeFlush wakes a flush waiting on the send queues (the session failed).
func (s *Session) wakeFlush() {
	for _, q := range s.out {
		if q == nil {
			continue
		}
		q.mu.Lock()
		q.idle.Broadcast()
		q.mu.Unlock()
	}
}

// fail records the session's first failure and returns it (or the earlier one).
func (s *Session) fail(err error) error {
	s.noteRejected(err)
	s.mu.Lock()
	if s.err != nil {
		e := s.err
		s.mu.Unlock()
		return e
	}
	s.err = err
	close(s.done)
	s.aborted = make(chan struct{})
	s.wg.Add(1)
	s.mu.Unlock()
	s.wakeFlush()
	s.log.Warn("all-reduce failed, aborting epoch", zap.Error(err))
	go s.abort(err)
	return err
}

// noteRejected passes err to the transport's FrameRejecter when it is the
// refusal of a peer's frame detected here (not a local failure, a timeout,
// a broken link, or a neighbour's abort notice).
func (s *Session) noteRejected(err error) {
	fr, ok := s.t.(FrameRejecter)
	if !ok {
		return
	}
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Reporter != s.ep.Self || pe.Peer == s.ep.Self {
		return
	}
	for _, refused := range []error{ErrBadFrame, ErrEpochMismatch, ErrCodecMismatch, ErrFrameTooLarge} {
		if errors.Is(pe.Err, refused) {
			fr.FrameRejected(pe.Peer, err)
			return
		}
	}
}

func (s *Session) errNow() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// abort tells every other peer (best effort) and resets the transport.
func (s *Session) abort(err error) {
	defer s.wg.Done()
	defer close(s.aborted)
	if s.t == nil {
		return
	}
	culprit := s.ep.Self
	var h Header
	h.Epoch = s.ep.Number
	var pe *PeerError
	if errors.As(err, &pe) {
		culprit = pe.Peer
		h.Step, h.Bucket = pe.Step, pe.Bucket
	}
	frame := marshalAbort(nil, h, culprit, kindOf(err), err.Error())
	// Not s.ctx: closing the session must not cut the notices short (a
	// peer that misses one blames this peer for the broken link instead of
	// the culprit); Close waits for them instead.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), abortTimeout)
	var wg sync.WaitGroup
	for i, p := range s.ep.Peers {
		if i == s.rank {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.t.Send(ctx, p, frame)
		}()
	}
	wg.Wait()
	cancel()
	s.t.Reset(err)
}

func (s *Session) peerErr(peer PeerID, step uint64, bucket uint32, err error) *PeerError {
	return &PeerError{Peer: peer, Reporter: s.ep.Self, Epoch: s.ep.Number, Step: step, Bucket: bucket, Err: err}
}

func (s *Session) readLoop(from int) {
	defer s.wg.Done()
	peer := s.ep.Peers[from]
	for {
		select {
		case <-s.done:
			return
		default:
		}
		b, err := s.recvFrame(peer)
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			if errors.Is(err, io.EOF) {
				// The peer closed the epoch cleanly (it finished its rounds).
				// Only a round still waiting for its frames fails.
				s.mu.Lock()
				s.ended[from] = true
				var wake []*mailbox
				for k, mb := range s.boxes {
					if k.from == from {
						wake = append(wake, mb)
					}
				}
				s.mu.Unlock()
				for _, mb := range wake {
					select {
					case mb.ready <- struct{}{}:
					default:
					}
				}
				return
			}
			if errors.Is(err, ErrFrameTooLarge) {
				s.fail(s.peerErr(peer, 0, 0, err))
			} else {
				s.fail(s.peerErr(peer, 0, 0, fmt.Errorf("%w: %w", ErrPeerFailed, err)))
			}
			return
		}
		h, p, err := UnmarshalFrame(b, s.max)
		if err != nil {
			s.fail(s.peerErr(peer, 0, 0, err))
			return
		}
		if h.Epoch != s.ep.Number {
			s.fail(s.peerErr(peer, h.Step, h.Bucket,
				fmt.Errorf("%w: frame epoch %d, want %d", ErrEpochMismatch, h.Epoch, s.ep.Number)))
			return
		}
		if h.Phase == PhaseAbort {
			culprit, kind, msg, err := unmarshalAbort(p)
			if err != nil {
				s.fail(s.peerErr(peer, h.Step, h.Bucket, err))
				return
			}
			if s.ep.Rank(culprit) < 0 {
				culprit = peer
			}
			s.fail(&PeerError{Peer: culprit, Reporter: peer, Epoch: s.ep.Number, Step: h.Step, Bucket: h.Bucket,
				Err: fmt.Errorf("%w: %s", sentinelOf(kind), msg)})
			return
		}
		key := boxKey{from: from, step: h.Step, bucket: h.Bucket, phase: h.Phase}
		s.mu.Lock()
		if s.rounds && (h.Step < s.round || h.Step > s.round+1) {
			base := s.round
			s.mu.Unlock()
			s.fail(s.peerErr(peer, h.Step, h.Bucket,
				fmt.Errorf("%w: frame for step %d outside the window [%d, %d]", ErrBadFrame, h.Step, base, base+1)))
			return
		}
		if s.buffered[from]+len(b) > s.cfg.MaxBufferedBytes {
			held := s.buffered[from]
			s.mu.Unlock()
			s.fail(s.peerErr(peer, h.Step, h.Bucket,
				fmt.Errorf("%w: %d bytes of its frames already wait unread (limit %d)", ErrFrameTooLarge, held, s.cfg.MaxBufferedBytes)))
			return
		}
		s.buffered[from] += len(b)
		mb := s.box(key)
		mb.q = append(mb.q, frameMsg{h: h, payload: p, raw: b})
		s.mu.Unlock()
		select {
		case mb.ready <- struct{}{}:
		default:
		}
	}
}

// box returns the mailbox for key; s.mu must be held.
func (s *Session) box(key boxKey) *mailbox {
	mb := s.boxes[key]
	if mb == nil {
		mb = &mailbox{ready: make(chan struct{}, 1)}
		s.boxes[key] = mb
	}
	return mb
}

// dropBoxes forgets the mailboxes of one bucket of one step.
func (s *Session) dropBoxes(step uint64, bucket uint32) {
	s.mu.Lock()
	for k, mb := range s.boxes {
		if k.step == step && k.bucket == bucket {
			for _, m := range mb.q {
				s.buffered[k.from] -= len(m.raw)
			}
			delete(s.boxes, k)
		}
	}
	s.mu.Unlock()
}

func (s *Session) writeLoop(to int) {
	defer s.wg.Done()
	peer := s.ep.Peers[to]
	q := s.out[to]
	for {
		q.mu.Lock()
		if len(q.q) == 0 {
			q.mu.Unlock()
			select {
			case <-q.ready:
				continue
			case <-s.done:
				return
			}
		}
		f := q.q[0]
		q.q[0] = outFrame{}
		q.q = q.q[1:]
		q.busy = true
		q.mu.Unlock()
		select {
		case <-s.done:
			s.wakeFlush()
			return
		default:
		}
		err := s.t.Send(s.ctx, peer, f.b)
		if f.recycle {
			s.frames.put(f.b) // the Transport does not retain it
		}
		q.mu.Lock()
		q.busy = false
		if q.drained() {
			q.idle.Broadcast()
		}
		q.mu.Unlock()
		if err != nil {
			// The reader of the same peer usually knows more (an abort
			// notice queued before the reset): give it a moment first.
			t := time.NewTimer(sendFailGrace)
			select {
			case <-s.done:
			case <-s.ctx.Done():
			case <-t.C:
				s.fail(s.peerErr(peer, 0, 0, fmt.Errorf("%w: send: %w", ErrPeerFailed, err)))
			}
			t.Stop()
			return
		}
	}
}

// send queues frame for peer rank to; it never blocks.
func (s *Session) send(to int, frame []byte) { s.enqueue(to, outFrame{b: frame}) }

// handOff is send for a frame that nothing else reads any more: the
// writer recycles its buffer once the Transport has it.
func (s *Session) handOff(to int, frame []byte) { s.enqueue(to, outFrame{b: frame, recycle: true}) }

func (s *Session) enqueue(to int, f outFrame) {
	s.queued.Add(uint64(len(f.b)))
	q := s.out[to]
	q.mu.Lock()
	q.q = append(q.q, f)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	// Let the writer, which the frame made runnable, take it now: on busy
	// cores it otherwise waited for the rest of the producing loop's time
	// slice. Four in-process peers on two cores began the direct
	// schedule's sends up to 15 ms after the round (64 MiB of onebit at
	// 95.6 Mbit/s: 0.89-0.90 of the link-limited ideal before, 0.95-0.96
	// after; top-k's all-gather 0.59 to 0.65; the ring, whose hops wait on
	// the network, unchanged).
	runtime.Gosched()
}

// op is the state of one bucket all-reduce (or one of its sub-reduces).
type op struct {
	s       *Session
	ctx     context.Context
	step    uint64
	bucket  uint32
	timeout time.Duration
	id      uint32
	// sendID and recvID override id for reduce-scatter frames sent to the
	// next peer and received from the previous one (per-link codecs).
	sendID, recvID uint32
	// recvd and expect measure the progress of the current schedule: a
	// peer that is further along waits longer past the deadline before
	// blaming its upstream peer, so the peer next to a stalled one fires
	// first and its abort notice names the right culprit everywhere.
	recvd, expect int
}

func (o *op) begin(expect int) {
	o.recvd, o.expect = 0, max(expect, 1)
}

// newFrame returns an empty frame (its header's room) with room for
// payload bytes, from the session's frame pool.
func (o *op) newFrame(payload int) []byte {
	return o.s.frames.get(HeaderSize + payload)[:HeaderSize]
}

// release recycles a frame that o received (o.recv's raw) or built, once
// nothing reads it any more: not queued with send, not held by a keep.
func (o *op) release(frame []byte) { o.s.frames.put(frame) }

// recvFrame reads the next frame from peer, into a recycled buffer when
// the Transport can (FrameReceiver).
func (s *Session) recvFrame(peer PeerID) ([]byte, error) {
	if fr, ok := s.t.(FrameReceiver); ok {
		return fr.RecvInto(s.ctx, peer, s.frames.get)
	}
	return s.t.Recv(s.ctx, peer)
}

// seal writes the header of frame f.
func (o *op) seal(f []byte, ph Phase, chunk int) error {
	if len(f) > o.s.max {
		return o.failLocal(fmt.Errorf("%w: encoded chunk %d is %d bytes > max frame %d", ErrFrameTooLarge, chunk, len(f), o.s.max))
	}
	id := o.id
	if ph.Kind() == PhaseReduce && o.sendID != 0 {
		id = o.sendID
	}
	PutHeader(f, Header{Phase: ph, Codec: id, Epoch: o.s.ep.Number, Step: o.step, Bucket: o.bucket,
		Chunk: uint32(chunk), Length: uint32(len(f) - HeaderSize)})
	return nil
}

func (o *op) failLocal(err error) error {
	if !errors.Is(err, ErrAborted) && !errors.Is(err, ErrConfig) && !errors.Is(err, ErrFrameTooLarge) {
		err = fmt.Errorf("%w: %w", ErrAborted, err)
	}
	return o.s.fail(o.s.peerErr(o.s.ep.Self, o.step, o.bucket, err))
}

func (o *op) failPeer(rank int, err error) error {
	return o.s.fail(o.s.peerErr(o.s.ep.Peers[rank], o.step, o.bucket, err))
}

// recv waits for the next frame of phase ph from rank from and checks its codec and chunk.
func (o *op) recv(from int, ph Phase, chunk int) (raw, payload []byte, err error) {
	s := o.s
	key := boxKey{from: from, step: o.step, bucket: o.bucket, phase: ph}
	s.mu.Lock()
	mb := s.box(key)
	s.mu.Unlock()
	var timer *time.Timer
	grace := false
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		s.mu.Lock()
		if len(mb.q) > 0 {
			m := mb.q[0]
			mb.q[0] = frameMsg{}
			mb.q = mb.q[1:]
			s.buffered[from] -= len(m.raw)
			s.mu.Unlock()
			want := o.id
			if ph.Kind() == PhaseReduce && o.recvID != 0 {
				want = o.recvID
			}
			if m.h.Codec != want {
				return nil, nil, o.failPeer(from, fmt.Errorf("%w: codec id %#x, want %#x", ErrCodecMismatch, m.h.Codec, want))
			}
			if m.h.Chunk != uint32(chunk) {
				return nil, nil, o.failPeer(from, fmt.Errorf("%w: phase %#x chunk %d, want %d", ErrBadFrame, ph, m.h.Chunk, chunk))
			}
			o.recvd++
			return m.raw, m.payload, nil
		}
		ended := s.ended[from]
		s.mu.Unlock()
		if ended {
			return nil, nil, o.failPeer(from, fmt.Errorf("%w: peer closed the epoch before sending phase %#x chunk %d", ErrPeerFailed, ph, chunk))
		}
		if timer == nil {
			timer = time.NewTimer(o.timeout)
		}
		select {
		case <-mb.ready:
		case <-s.done:
			return nil, nil, s.errNow()
		case <-o.ctx.Done():
			return nil, nil, o.failLocal(fmt.Errorf("%w: %w", ErrAborted, o.ctx.Err()))
		case <-timer.C:
			if !grace {
				grace = true
				if extra := time.Duration(float64(o.timeout) * min(1, float64(o.recvd)/float64(o.expect))); extra > 0 {
					timer.Reset(extra)
					continue
				}
			}
			return nil, nil, o.failPeer(from, fmt.Errorf("%w: no frame (phase %#x, chunk %d) within %v", ErrTimeout, ph, chunk, o.timeout))
		}
	}
}
