package allreduce

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/p2ptrain/p2ptrain/compress"
)

// Bucket is one fusion bucket of a step handed to a Round.
type Bucket struct {
	// ID identifies the bucket within the step; every peer must use the same
	// IDs, hand buckets over in the same order, and pair each ID with the
	// same codec spec and length.
	ID uint32
	// Codec is this peer's codec instance for the bucket (it owns the
	// bucket's error-feedback state).
	Codec compress.Codec
	// Data is this peer's local gradient. It is read while the round runs and
	// must not change until Wait returns.
	Data []float32
	// Out receives the average over all peers, identical bit for bit on
	// every peer, and only when the whole round succeeds. It may alias Data.
	Out []float32
	// InPlace lets the round write the average straight into Out as each
	// chunk completes, instead of into a scratch that Wait copies out: one
	// pass over the bucket less, and no bucket-sized scratch. If the round
	// fails, Out then holds a mix of averages and (when it aliases Data)
	// local values: set it only when a retry recomputes or re-copies Data,
	// as the trainer does. Aliasing stays safe: every schedule reads a
	// chunk's Data before it writes that chunk's average. Low-rank codecs
	// ignore it.
	InPlace bool
	// Links optionally gives per-link codecs (see EdgeCodecs). They are used
	// by the ring schedule of ClassLinear and ClassQuantized codecs and
	// ignored otherwise.
	Links *LinkCodecs
}

// LinkCodecs are a bucket's codecs for this peer's ring links, all of the
// Codec's family and class. Every peer must build them from the same
// EdgeCodecs so that neighbours agree: this peer's Send spec is the next
// peer's Recv spec, and Final is the same everywhere.
type LinkCodecs struct {
	// Send encodes reduce-scatter frames to the next peer (spec of edge self → next).
	Send compress.Codec
	// Recv decodes reduce-scatter frames from the previous peer (edge prev → self).
	Recv compress.Codec
	// Final encodes the owner's bytes and decodes the all-gather: the spec of
	// the slowest edge, identical on every peer. Nil means Bucket.Codec.
	Final compress.Codec
}

// Round is the all-reduce of one training step's buckets. The caller Adds
// buckets as they become ready (backward order); each one's all-reduce starts
// at once, at most Config.Concurrency at a time in the order they were
// added. Wait then blocks until all are done and copies every result out
// (but for InPlace buckets, already written).
//
// If the round fails, no Out is written (InPlace buckets' may be): the
// caller keeps (or recomputes) its gradients and retries the step in the
// next epoch. Codecs with error feedback
// (ClassErrorFeedback, ClassSparse) have then advanced their residuals; call
// their Reset before the retry. Low-rank codecs: call ResetShared at the
// epoch change on every peer.
type Round struct {
	s    *Session
	ctx  context.Context
	step uint64

	mu      sync.Mutex
	queue   []*job
	ready   chan struct{}
	closed  bool
	ids     map[uint32]bool
	jobs    []*job
	wg      sync.WaitGroup
	dispWG  sync.WaitGroup
	addErr  error
	waited  bool
	started bool
}

type job struct {
	b       Bucket
	scratch []float32
	err     error
	ran     bool
}

// NewRound starts the round of training step step. Canceling ctx aborts the
// round (and the session).
func (s *Session) NewRound(ctx context.Context, step uint64) *Round {
	s.mu.Lock()
	s.round, s.rounds = step, true
	// Frames that arrived before this round must fit its window too.
	var stray *boxKey
	for k, mb := range s.boxes {
		if len(mb.q) > 0 && (k.step < step || k.step > step+1) {
			stray = &k
			break
		}
	}
	s.mu.Unlock()
	if stray != nil {
		s.fail(s.peerErr(s.ep.Peers[stray.from], stray.step, stray.bucket,
			fmt.Errorf("%w: frame for step %d outside the window [%d, %d]", ErrBadFrame, stray.step, step, step+1)))
	}
	r := &Round{s: s, ctx: ctx, step: step, ready: make(chan struct{}, 1), ids: make(map[uint32]bool)}
	r.dispWG.Add(1)
	go r.dispatch()
	return r
}

// Add hands over a bucket; it does not block on the network.
func (r *Round) Add(b Bucket) error {
	var err error
	switch {
	case b.Codec == nil:
		err = fmt.Errorf("%w: bucket %d: nil codec", ErrConfig, b.ID)
	case b.Links != nil && (b.Links.Send == nil || b.Links.Recv == nil):
		err = fmt.Errorf("%w: bucket %d: link codecs need Send and Recv", ErrConfig, b.ID)
	case len(b.Out) != len(b.Data):
		err = fmt.Errorf("%w: bucket %d: len(Out) %d != len(Data) %d", ErrConfig, b.ID, len(b.Out), len(b.Data))
	}
	r.mu.Lock()
	if err == nil && r.closed {
		err = fmt.Errorf("%w: bucket %d added after Wait", ErrConfig, b.ID)
	}
	if err == nil && r.ids[b.ID] {
		err = fmt.Errorf("%w: bucket %d added twice", ErrConfig, b.ID)
	}
	if err != nil {
		if r.addErr == nil {
			r.addErr = err
		}
		r.mu.Unlock()
		// The other peers would wait for this bucket: fail the session.
		return r.s.fail(r.s.peerErr(r.s.ep.Self, r.step, b.ID, err))
	}
	r.ids[b.ID] = true
	j := &job{b: b}
	r.queue = append(r.queue, j)
	r.jobs = append(r.jobs, j)
	r.mu.Unlock()
	select {
	case r.ready <- struct{}{}:
	default:
	}
	return nil
}

// dispatch starts queued buckets in order, bounded by the session semaphore.
func (r *Round) dispatch() {
	defer r.dispWG.Done()
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			closed := r.closed
			r.mu.Unlock()
			if closed {
				return
			}
			select {
			case <-r.ready:
			case <-r.s.done:
				return // Wait reports the jobs that never ran
			}
			continue
		}
		j := r.queue[0]
		r.queue = r.queue[1:]
		r.mu.Unlock()
		select {
		case r.s.sem <- struct{}{}:
		case <-r.s.done:
			return
		}
		j.ran = true
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer func() { <-r.s.sem }()
			// Low-rank codecs build their output from a cleared buffer
			// while Data is still to be factored: never in place.
			class := j.b.Codec.Class()
			out := j.b.Out
			if !j.b.InPlace || class == compress.ClassLowRank {
				j.scratch = r.s.floats.get(len(j.b.Data))
				out = j.scratch
			}
			readyScratch(out, class, j.scratch == nil)
			j.err = r.s.reduceBucket(r.ctx, r.step, j.b, out)
		}()
	}
}

// scratchPoison, set by the package's tests, fills every scratch that
// readyScratch does not clear with NaN, so that a schedule that leaves a
// value unwritten fails their checks instead of passing an earlier round's.
var scratchPoison bool

// readyScratch prepares the output of a bucket of codec class c: a pooled
// scratch (stale contents), or with inPlace the bucket's Out. The schedules of every class but low-rank write each
// output value exactly once on success (finish decodes every chunk of the
// layout, and the layout tiles the bucket), so they skip clearing it: a
// pass over the whole gradient that cost about a tenth of a 64 MiB onebit
// all-reduce's CPU. Low-rank codecs build their output in Absorb, which is
// not bound to that rule, and get a cleared buffer.
func readyScratch(b []float32, c compress.Class, inPlace bool) {
	switch {
	case c == compress.ClassLowRank:
		clear(b)
	case scratchPoison && !inPlace: // Out may alias Data, which is still to be read
		nan := float32(math.NaN())
		for i := range b {
			b[i] = nan
		}
	}
}

// Wait waits for every added bucket. On success it copies each bucket's
// average into its Out and returns nil; otherwise it returns the session's
// failure (a *PeerError) and writes nothing.
func (r *Round) Wait() error {
	r.mu.Lock()
	if r.waited {
		r.mu.Unlock()
		return fmt.Errorf("%w: Wait called twice", ErrConfig)
	}
	r.waited = true
	r.closed = true
	r.mu.Unlock()
	select {
	case r.ready <- struct{}{}:
	default:
	}
	r.dispWG.Wait()
	r.wg.Wait()
	var err error
	for _, j := range r.jobs {
		if j.err != nil {
			err = j.err
			break
		}
		if !j.ran {
			if err = r.s.errNow(); err == nil {
				err = fmt.Errorf("%w: bucket %d did not run", ErrAborted, j.b.ID)
			}
			break
		}
	}
	if err == nil {
		err = r.addErr
	}
	if err == nil {
		if serr := r.s.errNow(); serr != nil && !errors.Is(serr, ErrClosed) {
			err = serr
		}
	}
	if err == nil {
		for _, j := range r.jobs {
			if j.scratch != nil { // nil: written in place
				copy(j.b.Out, j.scratch)
			}
		}
	} else if e := r.s.errNow(); e != nil {
		err = e
	}
	for _, j := range r.jobs {
		r.s.floats.put(j.scratch) // every job is done: no one writes it now
		j.scratch = nil
	}
	return err
}

// AllReduce is a Round with a single bucket.
func (s *Session) AllReduce(ctx context.Context, step uint64, b Bucket) error {
	r := s.NewRound(ctx, step)
	if err := r.Add(b); err != nil {
		_ = r.Wait()
		return err
	}
	return r.Wait()
}
