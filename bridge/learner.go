package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/train"
)

// callbackTimeout bounds one answer on the callback connection (a state of
// a large model takes a while to serialize).
const callbackTimeout = 5 * time.Minute

// errClosed: the training process closed its connection.
var errClosed = errors.New("bridge: the training process disconnected")

// Learner is a train.Learner whose model lives in a training process
// connected over the socket (one session). Compute hands the trainer the
// buckets the process's backward filled; Apply writes the averages back
// and lets the process step its optimizer.
type Learner struct {
	log      *zap.Logger
	main, cb net.Conn
	mem      *shm
	lay      *layout
	settings train.Settings
	step0    uint64
	steps    uint64
	check    int
	dir      string
	prefix   string

	wmu  sync.Mutex // writes on main
	cbmu sync.Mutex // one request at a time on cb

	// mu guards final and orders it with the reader's pushes to msgs.
	mu    sync.Mutex
	final *waitReply    // the answer to every wait once the run is over
	told  chan struct{} // closed once the process got the final answer
	tell  sync.Once
	msgs  chan stepMsg
	// readErr is set before readDone closes.
	readErr  error
	readDone chan struct{}

	seq atomic.Uint64 // state files
	// pending is the step count an "averaged" answer told the process to
	// reach without asking it to confirm (0: none, or confirmed since by
	// a message of its next step). Callback requests carry it (After).
	pending   atomic.Uint64
	closeOnce sync.Once
	closeErr  error

	// The rest belongs to the trainer's goroutine.
	cur     uint64   // steps the process's state has completed
	have    []uint64 // per bucket: 1 + the step of the gradient in shm (0: none)
	waiting *stepMsg // the process's unanswered wait
	// The trainer averages each bucket in place in the gradient region, so
	// that the process reads the averages where it wrote its gradient; a
	// retried step needs that gradient again, kept in backup.
	backup    [][]float32  // per bucket: the process's gradient as it last wrote it
	handed    []bool       // per bucket: the region went to the trainer since the process wrote it
	paramsAt  int64        // the step whose parameters the param region holds (-1: none)
	paramHash string       // the process's hash of them
	lastState atomic.Value // *model.Checkpoint of the final step, kept for late peers
}

var _ train.Learner = (*Learner)(nil)

func newLearner(log *zap.Logger, main net.Conn, mem *shm, lay *layout, settings train.Settings, h *hello, o Options, dir, prefix string) *Learner {
	l := &Learner{log: log, main: main, mem: mem, lay: lay, settings: settings, step0: h.Step, cur: h.Step,
		steps: o.Steps, check: o.CheckEvery, dir: dir, prefix: prefix,
		msgs: make(chan stepMsg, len(lay.sizes)+8), readDone: make(chan struct{}), told: make(chan struct{}),
		have: make([]uint64, len(lay.sizes)), handed: make([]bool, len(lay.sizes)), paramsAt: int64(h.Step), paramHash: h.Hash}
	for _, n := range lay.sizes {
		l.backup = append(l.backup, make([]float32, n))
	}
	return l
}

// start begins reading the main connection (once the callback one is there).
func (l *Learner) start(cb net.Conn) {
	l.cb = cb
	go l.read()
}

// read receives the process's messages on the main connection until it
// closes, answering waits itself once the run is over.
func (l *Learner) read() {
	err := l.readLoop()
	l.readErr = err
	close(l.readDone)
}

func (l *Learner) readLoop() error {
	for {
		body, err := readMsg(l.main)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return errClosed
			}
			return fmt.Errorf("bridge: reading from the training process: %w", err)
		}
		var m stepMsg
		if err := decode(body, &m); err != nil {
			return err
		}
		switch m.Op {
		case "grad":
			if m.Bucket == nil || *m.Bucket < 0 || *m.Bucket >= len(l.lay.sizes) {
				return fmt.Errorf("%w: grad for bucket %v of %d", ErrBadMessage, m.Bucket, len(l.lay.sizes))
			}
		case "wait", "applied", "restored":
		default:
			return fmt.Errorf("%w: unknown op %q on the main connection", ErrBadMessage, m.Op)
		}
		l.mu.Lock()
		if l.final != nil && m.Op == "wait" {
			r := *l.final
			l.mu.Unlock()
			if err := l.reply(r); err != nil {
				return err
			}
			l.tell.Do(func() { close(l.told) })
			continue
		}
		select {
		case l.msgs <- m:
			l.mu.Unlock()
		default:
			l.mu.Unlock()
			return fmt.Errorf("%w: more messages than a step has", ErrBadMessage)
		}
	}
}

// reply answers the process's wait.
func (l *Learner) reply(r waitReply) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := writeMsg(l.main, r); err != nil {
		return fmt.Errorf("%w: %w", train.ErrLearner, err)
	}
	return nil
}

// next returns the process's next message on the main connection. Any
// message confirms a pending update: the process sends none between an
// "averaged" answer and applying it.
func (l *Learner) next(ctx context.Context) (stepMsg, error) {
	select {
	case m := <-l.msgs:
		l.pending.Store(0)
		return m, nil
	case <-ctx.Done():
		return stepMsg{}, ctx.Err()
	case <-l.readDone:
		select {
		case m := <-l.msgs: // what arrived before it closed
			l.pending.Store(0)
			return m, nil
		default:
		}
		return stepMsg{}, fmt.Errorf("%w: %w", train.ErrLearner, l.readErr)
	}
}

// absorb records a grad or wait message; applied and restored come only
// as answers and are errors here.
func (l *Learner) absorb(m stepMsg) error {
	switch m.Op {
	case "grad":
		l.handed[*m.Bucket] = false // the process wrote the region anew
		if m.Step == l.cur {
			l.have[*m.Bucket] = m.Step + 1
		} else {
			l.log.Debug("dropping a gradient of another step", zap.Uint64("step", m.Step), zap.Uint64("current", l.cur))
		}
	case "wait":
		if l.waiting != nil {
			return fmt.Errorf("%w: %w: a second wait (step %d) before the first was answered", train.ErrLearner, ErrBadMessage, m.Step)
		}
		l.waiting = &m
	default:
		return fmt.Errorf("%w: %w: %q out of turn", train.ErrLearner, ErrBadMessage, m.Op)
	}
	return nil
}

// Buckets implements train.Learner.
func (l *Learner) Buckets() []compress.Layout { return l.lay.buckets }

// NumParams implements train.Learner.
func (l *Learner) NumParams() int { return l.lay.n }

// Devices implements train.Learner: the process counts as one device.
func (l *Learner) Devices() []string { return []string{"external"} }

// Settings implements train.Learner: the layout and the process's settings.
func (l *Learner) Settings() train.Settings { return l.settings }

// Step implements train.Learner: the step the process registered with.
func (l *Learner) Step() uint64 { return l.step0 }

// MaxStateBytes implements train.Learner: the parameters, up to three
// optimizer buffers of the same size, and 64 MiB of the process's extras.
func (l *Learner) MaxStateBytes() uint64 { return uint64(l.lay.n)*16 + 64<<20 }

// Compute implements train.Learner: it hands over each bucket once the
// process said its gradient for step is in shared memory, in bucket
// order, then waits for the process's wait and returns its loss. A retry
// of the same step takes the same gradients again.
//
// Each bucket is handed over as its part of the gradient region, which
// the trainer averages in place (so Apply copies nothing); the first
// hand-over of a gradient backs it up, and a retry restores the region
// from that backup.
func (l *Learner) Compute(ctx context.Context, step uint64, _ train.Shard, ready func(b int, g []float32)) (float64, error) {
	if step != l.cur {
		return 0, fmt.Errorf("%w: the trainer is at step %d, the training process at %d", train.ErrLearner, step, l.cur)
	}
	for b, backup := range l.backup {
		for l.have[b] != step+1 {
			if l.waiting != nil {
				return 0, fmt.Errorf("%w: %w: the training process waits for step %d without having sent bucket %d", train.ErrLearner, ErrBadMessage, l.waiting.Step, b)
			}
			m, err := l.next(ctx)
			if err != nil {
				return 0, err
			}
			if err := l.absorb(m); err != nil {
				return 0, err
			}
		}
		off := l.lay.offsets[b]
		region := l.mem.grads[off : off+len(backup) : off+len(backup)]
		if l.handed[b] {
			copy(region, backup)
		} else {
			copy(backup, region)
			l.handed[b] = true
		}
		ready(b, region)
	}
	for l.waiting == nil {
		m, err := l.next(ctx)
		if err != nil {
			return 0, err
		}
		if err := l.absorb(m); err != nil {
			return 0, err
		}
	}
	if l.waiting.Step != step {
		return 0, fmt.Errorf("%w: the training process waits for step %d, the trainer is at %d", train.ErrLearner, l.waiting.Step, step)
	}
	loss := -1.0 // unknown: the process sent none (or not a finite one)
	if l.waiting.Loss != nil {
		loss = *l.waiting.Loss
	}
	return loss, nil
}

// Apply implements train.Learner: the averages are in shared memory
// already (the trainer wrote them over the gradients Compute handed it)
// and the process steps its optimizer. Only when a check or the last step
// needs its parameter hash does Apply wait for it to say so ("applied");
// otherwise its next step's messages say it, and a callback request in
// between tells it to answer after its update (callbackReq.After).
func (l *Learner) Apply(ctx context.Context, step uint64) error {
	if l.waiting == nil || l.waiting.Step != step {
		return fmt.Errorf("%w: applying step %d, but the training process does not wait for it", train.ErrLearner, step)
	}
	last := l.steps > 0 && step+1 >= l.steps
	want := last || (l.check > 0 && (step+1)%uint64(l.check) == 0)
	if !want {
		l.pending.Store(step + 1) // before the answer: the process may act on it at once
	}
	if err := l.reply(waitReply{Status: "averaged", Step: step, WantHash: want, Last: last}); err != nil {
		return err
	}
	l.waiting = nil
	l.paramsAt = -1
	if !want {
		l.cur = step + 1
		return nil
	}
	// Once the averages are out the process applies them whatever happens
	// to the trainer's step: wait for its answer regardless of ctx, or
	// this learner would count one step fewer than the process.
	m, err := l.answer(context.WithoutCancel(ctx), "applied", step)
	if err != nil {
		return err
	}
	l.cur = step + 1
	l.paramsAt, l.paramHash = int64(l.cur), m.Hash
	if last {
		// Keep the final state: a peer whose last round failed may still
		// fetch it after the process has gone.
		c, err := l.fetchState(l.cur)
		if err != nil {
			return err
		}
		l.lastState.Store(c)
	}
	return nil
}

// answer waits for the process's answer op (applied or restored) for step.
func (l *Learner) answer(ctx context.Context, op string, step uint64) (stepMsg, error) {
	m, err := l.next(ctx)
	if err != nil {
		return m, err
	}
	if m.Op != op || m.Step != step {
		return m, fmt.Errorf("%w: %w: expected %s for step %d, got %s for step %d", train.ErrLearner, ErrBadMessage, op, step, m.Op, m.Step)
	}
	if m.Hash != "" && !hexHash.MatchString(m.Hash) {
		return m, fmt.Errorf("%w: %w: %s with hash %q", train.ErrLearner, ErrBadMessage, op, m.Hash)
	}
	return m, nil
}

// Params implements train.Learner: the parameter region, refreshed by a
// hash request when the process has stepped since it last wrote it. The
// region must hash to what the process said.
func (l *Learner) Params(context.Context) ([]float32, error) {
	if l.paramsAt != int64(l.cur) || l.paramHash == "" {
		var rep callbackReply
		if err := l.call(callbackReq{Op: "hash"}, &rep); err != nil {
			return nil, err
		}
		if !rep.OK || rep.Step != l.cur || !hexHash.MatchString(rep.Hash) {
			return nil, fmt.Errorf("%w: the training process answered a hash request with step %d, hash %q (want step %d): %s", train.ErrLearner, rep.Step, rep.Hash, l.cur, rep.Error)
		}
		l.paramsAt, l.paramHash = int64(l.cur), rep.Hash
	}
	if h := model.HashFloats(l.mem.param); h != l.paramHash {
		return nil, fmt.Errorf("%w: the parameters in shared memory hash to %s, the training process says %s", train.ErrLearner, h, l.paramHash)
	}
	return l.mem.param, nil
}

// call sends req on the callback connection and decodes the answer.
func (l *Learner) call(req callbackReq, rep *callbackReply) error {
	l.cbmu.Lock()
	defer l.cbmu.Unlock()
	l.cb.SetDeadline(time.Now().Add(callbackTimeout))
	defer l.cb.SetDeadline(time.Time{})
	req.After = l.pending.Load()
	if err := writeMsg(l.cb, req); err != nil {
		return fmt.Errorf("%w: asking the training process for %s: %w", train.ErrLearner, req.Op, err)
	}
	body, err := readMsg(l.cb)
	if err != nil {
		return fmt.Errorf("%w: waiting for the training process's %s: %w", train.ErrLearner, req.Op, err)
	}
	if err := decode(body, rep); err != nil {
		return fmt.Errorf("%w: %w", train.ErrLearner, err)
	}
	return nil
}

// State implements train.Learner: the process writes its state to a file
// beside the shared memory; the final step's state is kept.
func (l *Learner) State(step uint64) (*model.Checkpoint, error) {
	if c, ok := l.lastState.Load().(*model.Checkpoint); ok && uint64(c.Step) == step {
		return &model.Checkpoint{Step: c.Step, Params: c.Params, Optimizer: c.Optimizer}, nil
	}
	return l.fetchState(step)
}

func (l *Learner) fetchState(step uint64) (*model.Checkpoint, error) {
	path, err := stateFile(l.dir, l.prefix, l.seq.Add(1))
	if err != nil {
		return nil, err
	}
	defer os.Remove(path)
	var rep callbackReply
	if err := l.call(callbackReq{Op: "state", Step: step, Path: path}, &rep); err != nil {
		return nil, err
	}
	if !rep.OK {
		return nil, fmt.Errorf("%w: the training process is at step %d: %s", train.ErrStateUnavailable, rep.Step, rep.Error)
	}
	p, e := rep.ParamsBytes, rep.ExtraBytes
	if p != 4*int64(l.lay.n) || e < 0 || uint64(p+e) > l.MaxStateBytes() {
		return nil, fmt.Errorf("%w: the training process wrote a state of %d parameter and %d extra bytes (want %d and at most %d)",
			train.ErrLearner, p, e, 4*l.lay.n, l.MaxStateBytes()-uint64(p))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bridge: reading the state: %w", err)
	}
	if int64(len(b)) < p+e {
		return nil, fmt.Errorf("%w: the state file holds %d bytes, the process announced %d", train.ErrLearner, len(b), p+e)
	}
	return &model.Checkpoint{Step: int64(step), Params: b[:p:p], Optimizer: b[p : p+e : p+e]}, nil
}

// Restore implements train.Learner: at the process's next wait it is told
// to load c (its gradients of that step are dropped), and it answers with
// the hash of what it loaded.
func (l *Learner) Restore(ctx context.Context, c *model.Checkpoint) error {
	path, err := stateFile(l.dir, l.prefix, l.seq.Add(1))
	if err != nil {
		return err
	}
	defer os.Remove(path)
	if err := os.WriteFile(path, slices.Concat(c.Params, c.Optimizer), 0o600); err != nil {
		return fmt.Errorf("bridge: writing the state: %w", err)
	}
	for l.waiting == nil {
		m, err := l.next(ctx)
		if err != nil {
			return err
		}
		if err := l.absorb(m); err != nil {
			return err
		}
	}
	step := uint64(c.Step)
	if err := l.reply(waitReply{Status: "restore", Step: step, Path: path,
		ParamsBytes: int64(len(c.Params)), ExtraBytes: int64(len(c.Optimizer))}); err != nil {
		return err
	}
	l.waiting = nil
	clear(l.have)
	m, err := l.answer(context.WithoutCancel(ctx), "restored", step)
	if err != nil {
		return err
	}
	l.cur = step
	l.paramsAt, l.paramHash = int64(step), m.Hash
	return nil
}

// Evaluate implements train.Learner: the process evaluates itself.
func (l *Learner) Evaluate() (model.Stats, error) { return model.Stats{}, train.ErrNoEvaluation }

// Finish answers the process's pending and future waits: "finished" when
// err is nil, else "stopped" with err (kind "settings" when the cluster
// trains with other settings). It returns once the process has the answer,
// has gone, or linger has passed, so that a daemon exiting right after
// does not cut the answer off.
func (l *Learner) Finish(err error, linger time.Duration) {
	r := waitReply{Status: "finished", Step: l.cur}
	if err != nil {
		r = waitReply{Status: "stopped", Step: l.cur, Kind: "error", Error: err.Error()}
		if errors.Is(err, train.ErrSettingsDiffer) {
			r.Kind = "settings"
		}
	}
	l.mu.Lock()
	l.final = &r
	l.mu.Unlock()
	for drained := false; !drained; {
		select {
		case m := <-l.msgs:
			if m.Op == "wait" {
				l.waiting = &m
			}
		default:
			drained = true
		}
	}
	if l.waiting != nil {
		l.waiting = nil
		if err := l.reply(r); err != nil {
			l.log.Debug("telling the training process the run is over", zap.Error(err))
		}
		l.tell.Do(func() { close(l.told) })
	}
	select {
	case <-l.told:
	case <-l.readDone:
	case <-time.After(linger):
	}
}

// Close implements train.Learner: it ends the session and removes the
// shared memory.
func (l *Learner) Close() error {
	l.closeOnce.Do(func() {
		l.main.Close()
		if l.cb != nil {
			l.cb.Close()
			<-l.readDone
		}
		l.closeErr = l.mem.close()
	})
	return l.closeErr
}
