package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// ErrBadState reports optimizer or checkpoint bytes that cannot be decoded.
var ErrBadState = errors.New("model: bad state")

// OptimConfig configures an optimizer, its learning-rate schedule and
// gradient clipping. Zero values take the defaults noted.
type OptimConfig struct {
	// Name is "sgd" (heavy-ball momentum), "nesterov" or "adamw" (default "sgd").
	Name string
	// LR is the peak learning rate (default 0.05 for sgd/nesterov, 1e-3 for adamw).
	LR float64
	// Momentum for sgd and nesterov (default 0.9; a negative value means none).
	Momentum float64
	// WeightDecay: L2 added to the gradient for sgd/nesterov, decoupled for
	// adamw. It applies to weights only, not biases or normalisation parameters.
	WeightDecay float64
	// Beta1, Beta2 and Eps for adamw (defaults 0.9, 0.999, 1e-8).
	Beta1, Beta2, Eps float64
	// WarmupSteps ramps the rate linearly from LR/WarmupSteps to LR.
	WarmupSteps int64
	// TotalSteps, if positive, decays the rate after warm-up along a cosine to
	// MinLR at TotalSteps; otherwise the rate stays at LR.
	TotalSteps int64
	// MinLR is the cosine schedule's final rate.
	MinLR float64
	// ClipNorm, if positive, rescales the gradient so its global L2 norm is at
	// most ClipNorm.
	ClipNorm float64
}

// OptimizerNames lists the optimizers NewOptimizer knows.
func OptimizerNames() []string { return []string{"adamw", "nesterov", "sgd"} }

// Optimizer updates a flat parameter vector from a flat gradient on the host.
// Its arithmetic is plain float32 with every product rounded explicitly, so
// the update is bit-identical on every peer whatever devices they compute on.
type Optimizer struct {
	cfg   OptimConfig
	decay []span // ranges of the flat vector that take weight decay
	n     int
	m, v  []float32 // momentum / Adam moments
}

type span struct{ lo, hi int }

// NewOptimizer returns an optimizer for m's parameters.
func NewOptimizer(cfg OptimConfig, m *Model) (*Optimizer, error) {
	var decay []span
	for _, b := range m.buckets {
		for _, t := range b.Tensors {
			if t.Decay {
				decay = append(decay, span{b.Offset + t.Offset, b.Offset + t.Offset + t.Len})
			}
		}
	}
	return newOptimizer(cfg, m.NumParams(), decay)
}

func newOptimizer(cfg OptimConfig, n int, decay []span) (*Optimizer, error) {
	cfg.Name = strings.ToLower(cfg.Name)
	if cfg.Name == "" {
		cfg.Name = "sgd"
	}
	var errs []error
	switch cfg.Name {
	case "sgd", "nesterov":
		if cfg.LR == 0 {
			cfg.LR = 0.05
		}
		if cfg.Momentum == 0 {
			cfg.Momentum = 0.9
		}
		if cfg.Momentum < 0 {
			cfg.Momentum = 0
		}
		if cfg.Momentum >= 1 {
			errs = append(errs, fmt.Errorf("momentum %v must be below 1", cfg.Momentum))
		}
		if cfg.Name == "nesterov" && cfg.Momentum == 0 {
			errs = append(errs, errors.New("nesterov needs a positive momentum"))
		}
	case "adamw":
		if cfg.LR == 0 {
			cfg.LR = 1e-3
		}
		if cfg.Beta1 == 0 {
			cfg.Beta1 = 0.9
		}
		if cfg.Beta2 == 0 {
			cfg.Beta2 = 0.999
		}
		if cfg.Eps == 0 {
			cfg.Eps = 1e-8
		}
		if cfg.Beta1 < 0 || cfg.Beta1 >= 1 || cfg.Beta2 < 0 || cfg.Beta2 >= 1 || cfg.Eps <= 0 {
			errs = append(errs, fmt.Errorf("adamw betas (%v, %v) must be in [0, 1) and eps %v positive", cfg.Beta1, cfg.Beta2, cfg.Eps))
		}
	default:
		return nil, fmt.Errorf("model: unknown optimizer %q (valid: %s)", cfg.Name, strings.Join(OptimizerNames(), ", "))
	}
	if cfg.LR < 0 || math.IsNaN(cfg.LR) || math.IsInf(cfg.LR, 0) {
		errs = append(errs, fmt.Errorf("learning rate %v must be positive", cfg.LR))
	}
	if cfg.WeightDecay < 0 || cfg.WarmupSteps < 0 || cfg.TotalSteps < 0 || cfg.MinLR < 0 || cfg.ClipNorm < 0 {
		errs = append(errs, errors.New("weight decay, warm-up, total steps, min lr and clip norm must not be negative"))
	}
	if cfg.TotalSteps > 0 && cfg.MinLR > cfg.LR {
		errs = append(errs, fmt.Errorf("min lr %v exceeds lr %v", cfg.MinLR, cfg.LR))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("model: optimizer %s: %w", cfg.Name, errors.Join(errs...))
	}
	o := &Optimizer{cfg: cfg, decay: decay, n: n}
	o.m = make([]float32, n)
	if cfg.Name == "adamw" {
		o.v = make([]float32, n)
	}
	return o, nil
}

// Config returns the configuration with defaults filled in.
func (o *Optimizer) Config() OptimConfig { return o.cfg }

// LR returns the learning rate of (0-based) step: linear warm-up, then
// constant or cosine decay.
func (o *Optimizer) LR(step int64) float64 {
	c := o.cfg
	if step < c.WarmupSteps {
		return c.LR * float64(step+1) / float64(c.WarmupSteps)
	}
	if c.TotalSteps <= 0 {
		return c.LR
	}
	span := c.TotalSteps - c.WarmupSteps
	if span <= 0 || step >= c.TotalSteps {
		return c.MinLR
	}
	p := float64(step-c.WarmupSteps) / float64(span)
	return c.MinLR + 0.5*(c.LR-c.MinLR)*(1+math.Cos(math.Pi*p))
}

// StepInfo reports what an optimizer step did.
type StepInfo struct {
	// LR used.
	LR float64
	// GradNorm is the global L2 norm of the gradient before clipping (computed
	// only when clipping is on; 0 otherwise).
	GradNorm float64
	// Clipped is true when the gradient was rescaled.
	Clipped bool
}

// GlobalNorm returns the L2 norm of g, accumulated in float64 in index order
// (each square is exact in float64, so the result is the same everywhere).
func GlobalNorm(g []float32) float64 {
	var s float64
	for _, v := range g {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}

// Step applies one update for (0-based) step to params from grads, which it
// may rescale in place when clipping. Both have the length the optimizer was
// made for.
func (o *Optimizer) Step(params, grads []float32, step int64) StepInfo {
	if len(params) != o.n || len(grads) != o.n {
		panic(fmt.Sprintf("model: optimizer for %d parameters given %d parameters and %d gradients", o.n, len(params), len(grads)))
	}
	info := StepInfo{LR: o.LR(step)}
	if o.cfg.ClipNorm > 0 {
		info.GradNorm = GlobalNorm(grads)
		if info.GradNorm > o.cfg.ClipNorm {
			s := float32(o.cfg.ClipNorm / (info.GradNorm + 1e-6))
			for i := range grads {
				grads[i] *= s
			}
			info.Clipped = true
		}
	}
	lr := float32(info.LR)
	wd := float32(o.cfg.WeightDecay)
	// Walk the vector in spans that alternate between no decay and decay.
	pos := 0
	run := func(lo, hi int, decay bool) {
		if lo >= hi {
			return
		}
		w := float32(0)
		if decay {
			w = wd
		}
		switch o.cfg.Name {
		case "sgd", "nesterov":
			o.sgd(params[lo:hi], grads[lo:hi], o.m[lo:hi], lr, w)
		case "adamw":
			o.adamw(params[lo:hi], grads[lo:hi], o.m[lo:hi], o.v[lo:hi], lr, w, step)
		}
	}
	for _, s := range o.decay {
		run(pos, s.lo, false)
		run(s.lo, s.hi, true)
		pos = s.hi
	}
	run(pos, o.n, false)
	return info
}

func (o *Optimizer) sgd(p, g, v []float32, lr, wd float32) {
	mom := float32(o.cfg.Momentum)
	nest := o.cfg.Name == "nesterov"
	g = g[:len(p)]
	v = v[:len(p)]
	for i := range p {
		gi := g[i]
		if wd != 0 {
			gi += float32(wd * p[i])
		}
		vi := float32(mom*v[i]) + gi
		v[i] = vi
		d := vi
		if nest {
			d = gi + float32(mom*vi)
		}
		p[i] -= float32(lr * d)
	}
}

func (o *Optimizer) adamw(p, g, m, v []float32, lr, wd float32, step int64) {
	b1, b2 := float32(o.cfg.Beta1), float32(o.cfg.Beta2)
	t := float64(step + 1)
	c1 := float32(1 / (1 - math.Pow(o.cfg.Beta1, t)))
	c2 := float32(1 / (1 - math.Pow(o.cfg.Beta2, t)))
	eps := float32(o.cfg.Eps)
	omb1, omb2 := 1-b1, 1-b2
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	for i := range p {
		gi := g[i]
		mi := float32(b1*m[i]) + float32(omb1*gi)
		vi := float32(b2*v[i]) + float32(omb2*float32(gi*gi))
		m[i], v[i] = mi, vi
		mh := float32(mi * c1)
		vh := float32(vi * c2)
		den := float32(math.Sqrt(float64(vh))) + eps
		upd := mh / den
		if wd != 0 {
			upd += float32(wd * p[i])
		}
		p[i] -= float32(lr * upd)
	}
}

const optMagic = "P2POPT1\x00"

// State returns the optimizer state (moment vectors) as bytes.
func (o *Optimizer) State() []byte {
	return optState(o.cfg.Name, int(o.n), [][]float32{o.m, o.v})
}

// SetState replaces the optimizer state with bytes from State of an optimizer
// of the same kind and size.
func (o *Optimizer) SetState(b []byte) error {
	if len(b) < len(optMagic)+1 || string(b[:len(optMagic)]) != optMagic {
		return fmt.Errorf("%w: optimizer state lacks its magic", ErrBadState)
	}
	b = b[len(optMagic):]
	nl := int(b[0])
	b = b[1:]
	if len(b) < nl+8 {
		return fmt.Errorf("%w: optimizer state truncated", ErrBadState)
	}
	if name := string(b[:nl]); name != o.cfg.Name {
		return fmt.Errorf("%w: optimizer state is for %q, this optimizer is %q", ErrBadState, name, o.cfg.Name)
	}
	b = b[nl:]
	if n := binary.LittleEndian.Uint64(b); n != uint64(o.n) {
		return fmt.Errorf("%w: optimizer state covers %d parameters, want %d", ErrBadState, n, o.n)
	}
	b = b[8:]
	if want := 4 * (len(o.m) + len(o.v)); len(b) != want {
		return fmt.Errorf("%w: optimizer state has %d bytes of moments, want %d", ErrBadState, len(b), want)
	}
	BytesToFloats(o.m, b)
	BytesToFloats(o.v, b[4*len(o.m):])
	return nil
}

// Reset zeroes the optimizer state.
func (o *Optimizer) Reset() {
	clear(o.m)
	clear(o.v)
}

// ApplyGradients runs the optimizer on the host parameters with the host
// gradients (Grads, already reduced across peers) for step, then copies the
// parameters to every replica.
func (m *Model) ApplyGradients(o *Optimizer, step int64) StepInfo {
	info := o.Step(m.params, m.grads, step)
	m.syncReplicas()
	return info
}

// TimeOptimizerStep returns the seconds per parameter of one step of an
// optimizer of cfg on m's parameters: the median of reps steps after an
// untimed one, on copies of the parameters and gradients, so m is left as
// it was. A projection prices a step's update with it.
func TimeOptimizerStep(cfg OptimConfig, m *Model, reps int) (float64, error) {
	if reps < 1 {
		return 0, fmt.Errorf("model: timing the optimizer with %d repetitions, want at least 1", reps)
	}
	o, err := NewOptimizer(cfg, m)
	if err != nil {
		return 0, err
	}
	params := append([]float32(nil), m.params...)
	grads := make([]float32, len(params))
	for i := range grads {
		grads[i] = float32(i%7-3) * 1e-4 // any gradient: the step's work does not depend on it
	}
	times := make([]time.Duration, 0, reps)
	for r := range reps + 1 {
		t0 := time.Now()
		o.Step(params, grads, int64(r))
		if r > 0 {
			times = append(times, time.Since(t0))
		}
	}
	return median(times).Seconds() / float64(max(len(params), 1)), nil
}
