package train

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/model"
)

// ParamSetter is a Learner whose parameters can be replaced in place (the
// outer step of DiLoCo sets them to the new anchor).
type ParamSetter interface {
	// SetParams replaces the parameters with p (bucket order, NumParams
	// values); the optimizer state is kept.
	SetParams(ctx context.Context, p []float32) error
}

// innerLearner is what DiLoCo drives: a Learner it can reset to the anchor.
type innerLearner interface {
	Learner
	ParamSetter
}

// DiLoCo is the low-communication Learner (train.sync_every = H > 1, after
// Douillard et al., "DiLoCo", 2023): each of its steps (an outer step) runs
// H steps of the inner learner on this peer's shards alone, then hands the
// Trainer the pseudo-gradient anchor − local parameters to all-reduce with
// any codec (the codecs' residuals carry the error feedback from one outer
// step to the next). Apply updates the anchor with the outer optimizer, SGD
// with Nesterov momentum (docs/low-communication.md has the formulas), and
// resets the inner learner to it, so every replica holds the same anchor
// after each outer step. The inner optimizer's state stays each peer's own.
//
// Inner step s·H + i of outer step s draws shard sh of the global batch of
// step s·H + i, so a run of H·T inner steps sees the same data whatever H
// and however many peers share the global batch.
//
// With Overlap, Compute hands over outer step s's pseudo-gradient and
// starts step s+1's inner steps at once, in the background, while the
// Trainer all-reduces: their starting point misses step s's outer update,
// which their result is moved onto one outer step late (see Compute).
type DiLoCo struct {
	inner   innerLearner
	h       uint64
	lr      float32
	mom     float32
	overlap bool
	steps   uint64 // outer steps in the run: no inner steps start past them
	// anchor is the parameters every peer agrees on; velocity the outer
	// momentum buffer; delta the pseudo-gradient handed to the Trainer
	// (bucket order, split at bounds into its buckets; the all-reduce
	// overwrites it with the average) and local this peer's own copy.
	anchor, velocity, delta, local []float32
	bounds                         []int

	// mu serialises the inner learner between Compute's inner steps and
	// State, which a joiner may ask for while an outer step computes.
	mu sync.Mutex
	// done says local holds the pseudo-gradient of step on shard, with
	// mean inner loss loss (a retried step reuses it); drifted that the
	// inner learner's parameters have left the anchor since the last
	// Apply or Restore.
	done, drifted bool
	step          uint64
	shard         Shard
	loss          float64

	// With overlap: start holds the inner parameters at the start of the
	// round in flight; bg, when not nil, delivers the result of the
	// background round bgStep; stop cancels it (Close).
	start  []float32
	bg     chan error
	bgStep uint64
	bgLoss float64
	bgCtx  context.Context
	stop   context.CancelFunc
}

// DiLoCoConfig is the outer loop's configuration.
type DiLoCoConfig struct {
	// H is the number of inner steps per outer step (≥ 2).
	H int
	// LR (> 0) and Momentum (in [0, 1)) are the outer optimizer's.
	LR, Momentum float64
	// Overlap runs each outer step's inner steps while the previous outer
	// step's all-reduce is in flight.
	Overlap bool
	// Steps is the number of outer steps of the run.
	Steps int
}

var _ Learner = (*DiLoCo)(nil)

// NewDiLoCo wraps l in the outer loop of cfg. l must be able to set its
// parameters (ParamSetter). DiLoCo owns l.
func NewDiLoCo(ctx context.Context, l Learner, cfg DiLoCoConfig) (*DiLoCo, error) {
	h, lr, mom := cfg.H, cfg.LR, cfg.Momentum
	in, ok := l.(innerLearner)
	switch {
	case !ok:
		return nil, errors.New("train: train.sync_every > 1 needs a learner that can set its parameters (the built-in models; not --trainer external)")
	case h < 2:
		return nil, fmt.Errorf("train: DiLoCo needs train.sync_every ≥ 2, got %d", h)
	case !(lr > 0) || math.IsInf(lr, 0):
		return nil, fmt.Errorf("train: train.outer_lr %g must be positive", lr)
	case !(mom >= 0 && mom < 1):
		return nil, fmt.Errorf("train: train.outer_momentum %g must be in [0, 1)", mom)
	}
	p, err := l.Params(ctx)
	if err != nil {
		return nil, fmt.Errorf("train: DiLoCo: the inner learner's parameters: %w", err)
	}
	d := &DiLoCo{inner: in, h: uint64(h), lr: float32(lr), mom: float32(mom), overlap: cfg.Overlap, steps: uint64(max(cfg.Steps, 0)),
		anchor: append([]float32(nil), p...), velocity: make([]float32, len(p)), delta: make([]float32, len(p)), local: make([]float32, len(p))}
	if d.overlap {
		d.start = make([]float32, len(p))
	}
	d.bgCtx, d.stop = context.WithCancel(context.Background())
	d.bounds = append(d.bounds, 0)
	for _, b := range l.Buckets() {
		d.bounds = append(d.bounds, d.bounds[len(d.bounds)-1]+b.Len())
	}
	if n := d.bounds[len(d.bounds)-1]; n != len(p) {
		return nil, fmt.Errorf("train: DiLoCo: the buckets hold %d values, the parameters %d", n, len(p))
	}
	return d, nil
}

// Buckets implements Learner: the inner learner's.
func (d *DiLoCo) Buckets() []compress.Layout { return d.inner.Buckets() }

// NumParams implements Learner.
func (d *DiLoCo) NumParams() int { return len(d.anchor) }

// Devices implements Learner.
func (d *DiLoCo) Devices() []string { return d.inner.Devices() }

// Settings implements Learner: the inner learner's and the outer loop's.
func (d *DiLoCo) Settings() Settings {
	s := d.inner.Settings()
	s["train.sync_every"] = strconv.FormatUint(d.h, 10)
	s["train.outer_lr"] = strconv.FormatFloat(float64(d.lr), 'g', -1, 32)
	s["train.outer_momentum"] = strconv.FormatFloat(float64(d.mom), 'g', -1, 32)
	s["train.outer_overlap"] = strconv.FormatBool(d.overlap)
	return s
}

// Step implements Learner: the outer steps the inner learner's state had
// completed when it was made.
func (d *DiLoCo) Step() uint64 { return d.inner.Step() / d.h }

// MaxStateBytes implements Learner: the inner learner's state and the
// outer momentum.
func (d *DiLoCo) MaxStateBytes() uint64 {
	return d.inner.MaxStateBytes() + uint64(len(d.velocity))*4 + 16
}

// Compute implements Learner: H inner steps from the anchor, then the
// pseudo-gradient anchor − parameters, bucket by bucket. It returns the
// mean inner training loss. A retried step (its all-reduce failed) on the
// same shard hands over the same pseudo-gradient without computing again;
// on another shard (the ring changed) it starts again from the anchor,
// with the inner optimizer's state as the first attempt left it.
//
// With overlap, outer step s's inner steps ran in the background from
// start, the parameters its predecessor's round ended at moved onto the
// anchor it handed over; its pseudo-gradient is start − end, what the
// round itself moved. The next round then starts at once, in the
// background, from anchor − that pseudo-gradient: it misses this step's
// outer update, which reaches it one outer step late. A retry hands over
// the same pseudo-gradient whatever the shard (the next round is under
// way already).
func (d *DiLoCo) Compute(ctx context.Context, step uint64, sh Shard, ready func(b int, g []float32)) (float64, error) {
	if !d.done || d.step != step || (d.shard != sh && !d.overlap) {
		var err error
		if d.overlap {
			err = d.computeOverlapped(ctx, step, sh)
		} else {
			err = d.compute(ctx, step, sh)
		}
		if err != nil {
			return 0, err
		}
	}
	copy(d.delta, d.local)
	for b := range len(d.bounds) - 1 {
		ready(b, d.delta[d.bounds[b]:d.bounds[b+1]])
	}
	return d.loss, nil
}

// compute takes outer step step's H inner steps on shard sh and leaves the
// pseudo-gradient in local.
func (d *DiLoCo) compute(ctx context.Context, step uint64, sh Shard) error {
	d.done = false
	if d.drifted {
		if err := d.setInner(ctx, d.anchor); err != nil {
			return err
		}
	}
	d.drifted = true
	loss, err := d.innerSteps(ctx, step, sh)
	if err != nil {
		return err
	}
	if err := d.measure(ctx, d.anchor); err != nil {
		return err
	}
	d.done, d.step, d.shard, d.loss = true, step, sh, loss
	return nil
}

// computeOverlapped finishes outer step step's round (waiting for the
// background one, or running it here when there is none: the first step,
// or after a Restore), leaves its pseudo-gradient in local, moves the
// inner parameters to anchor − local and starts the next round.
func (d *DiLoCo) computeOverlapped(ctx context.Context, step uint64, sh Shard) error {
	d.done = false
	var loss float64
	if d.bg != nil && d.bgStep == step {
		if err := <-d.bg; err != nil {
			d.bg = nil
			return err
		}
		d.bg, loss = nil, d.bgLoss
	} else {
		if err := d.wait(); err != nil {
			return err
		}
		copy(d.start, d.anchor)
		if err := d.setInner(ctx, d.start); err != nil {
			return err
		}
		var err error
		if loss, err = d.innerSteps(ctx, step, sh); err != nil {
			return err
		}
	}
	if err := d.measure(ctx, d.start); err != nil {
		return err
	}
	d.done, d.step, d.shard, d.loss = true, step, sh, loss
	for i, a := range d.anchor {
		d.start[i] = a - d.local[i]
	}
	if err := d.setInner(ctx, d.start); err != nil {
		return err
	}
	d.drifted = true
	if next := step + 1; next < d.steps {
		d.bg, d.bgStep = make(chan error, 1), next
		go func() {
			l, err := d.innerSteps(d.bgCtx, next, sh)
			d.bgLoss = l
			d.bg <- err
		}()
	}
	return nil
}

// wait waits for the background round, if one is in flight, and returns
// its error.
func (d *DiLoCo) wait() error {
	if d.bg == nil {
		return nil
	}
	err := <-d.bg
	d.bg = nil
	return err
}

// innerSteps takes outer step step's H inner steps on shard sh and returns
// their mean loss.
func (d *DiLoCo) innerSteps(ctx context.Context, step uint64, sh Shard) (float64, error) {
	var sum float64
	for i := range d.h {
		loss, err := d.innerStep(ctx, step*d.h+i, sh)
		if err != nil {
			return 0, err
		}
		sum += loss
	}
	return sum / float64(d.h), nil
}

// measure sets local to from − the inner parameters.
func (d *DiLoCo) measure(ctx context.Context, from []float32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, err := d.inner.Params(ctx)
	if err != nil {
		return err
	}
	for i, a := range from {
		d.local[i] = a - p[i]
	}
	return nil
}

// innerStep computes and applies inner step s on the local shard alone.
func (d *DiLoCo) innerStep(ctx context.Context, s uint64, sh Shard) (float64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	loss, err := d.inner.Compute(ctx, s, sh, func(int, []float32) {})
	if err != nil {
		return 0, err
	}
	return loss, d.inner.Apply(ctx, s)
}

// setInner resets the inner learner's parameters to p.
func (d *DiLoCo) setInner(ctx context.Context, p []float32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inner.SetParams(ctx, p)
}

// Apply implements Learner: the outer step with the averaged
// pseudo-gradient Δ (what the all-reduce wrote into Compute's buckets),
// SGD with Nesterov momentum μ and rate η: v ← μ·v + Δ, anchor ← anchor −
// η·(Δ + μ·v); then the inner learner restarts from the anchor.
func (d *DiLoCo) Apply(ctx context.Context, _ uint64) error {
	for i, g := range d.delta {
		v := d.mom*d.velocity[i] + g
		d.velocity[i] = v
		d.anchor[i] -= d.lr * (g + d.mom*v)
	}
	d.done = false
	if d.overlap {
		return nil // the next round is under way from anchor − Δ (computeOverlapped)
	}
	if err := d.setInner(ctx, d.anchor); err != nil {
		return err
	}
	d.drifted = false
	return nil
}

// Params implements Learner: the anchor (what every replica agrees on).
func (d *DiLoCo) Params(context.Context) ([]float32, error) { return d.anchor, nil }

// diLoCoMagic starts the optimizer section of a DiLoCo state: the outer
// momentum, then the inner learner's optimizer state.
const diLoCoMagic = "DILOCO01"

// State implements Learner: the anchor as the parameters, and as the
// optimizer state the outer momentum followed by the inner learner's. The
// Trainer calls it between Apply and the next Apply; while an outer step
// computes, the inner optimizer's state is the one after some of its inner
// steps (that state is each peer's own, and a joiner only starts from it).
func (d *DiLoCo) State(step uint64) (*model.Checkpoint, error) {
	d.mu.Lock()
	c, err := d.inner.State(step * d.h)
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	opt := make([]byte, 0, len(diLoCoMagic)+8+4*len(d.velocity)+len(c.Optimizer))
	opt = append(opt, diLoCoMagic...)
	opt = binary.LittleEndian.AppendUint64(opt, uint64(len(d.velocity)))
	opt = append(opt, model.FloatBytes(d.velocity)...)
	c.Optimizer = append(opt, c.Optimizer...)
	c.Params = model.FloatBytes(d.anchor)
	c.Step = int64(step)
	return c, nil
}

// Restore implements Learner.
func (d *DiLoCo) Restore(ctx context.Context, c *model.Checkpoint) error {
	o := c.Optimizer
	head := len(diLoCoMagic) + 8
	if len(o) < head || string(o[:len(diLoCoMagic)]) != diLoCoMagic {
		return errors.New("train: the state has no DiLoCo outer momentum (was it written with train.sync_every = 1?)")
	}
	n := binary.LittleEndian.Uint64(o[len(diLoCoMagic):])
	if n != uint64(len(d.velocity)) || uint64(len(o)-head) < 4*n {
		return fmt.Errorf("train: the state's DiLoCo outer momentum holds %d values, the model %d", n, len(d.velocity))
	}
	if len(c.Params) != 4*len(d.anchor) {
		return fmt.Errorf("train: the state's parameters are %d bytes, want %d", len(c.Params), 4*len(d.anchor))
	}
	if err := d.wait(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("train: DiLoCo: the background round before the restore: %w", err)
	}
	inner := *c
	inner.Step = c.Step * int64(d.h)
	inner.Optimizer = o[head+4*len(d.velocity):]
	d.mu.Lock()
	err := d.inner.Restore(ctx, &inner)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	model.BytesToFloats(d.velocity, o[head:])
	model.BytesToFloats(d.anchor, c.Params)
	d.done, d.drifted = false, false
	return nil
}

// Evaluate implements Learner: the inner learner's, which holds the anchor
// between outer steps. With overlap it waits for the background round and
// evaluates the anchor in place of the round's parameters, which it puts
// back; the round's result waits for the next Compute.
func (d *DiLoCo) Evaluate() (model.Stats, error) {
	if !d.overlap {
		return d.inner.Evaluate()
	}
	if d.bg != nil {
		err := <-d.bg
		ch := make(chan error, 1) // the next Compute takes the result as if it were still running
		ch <- err
		d.bg = ch
	}
	ctx := context.Background()
	p, err := d.inner.Params(ctx)
	if err != nil {
		return model.Stats{}, err
	}
	saved := append([]float32(nil), p...)
	if err := d.setInner(ctx, d.anchor); err != nil {
		return model.Stats{}, err
	}
	st, err := d.inner.Evaluate()
	return st, errors.Join(err, d.setInner(ctx, saved))
}

// Close implements Learner: it stops the background round, if any.
func (d *DiLoCo) Close() error {
	d.stop()
	d.wait()
	return d.inner.Close()
}
