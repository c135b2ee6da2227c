package model

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// LayerInfo describes one layer of a network's layer list: what a pipeline
// split (docs/pipeline.md) weighs when it cuts the list into stages.
type LayerInfo struct {
	// Describe is the layer's description, e.g. "block(d=256,h=4,t=128)".
	Describe string
	// Params is the number of parameters the layer owns.
	Params int
	// Tied is the index of the layer whose parameters this one uses too
	// (the gpt's head uses the embedding's token table), or -1; TiedParams
	// is their number. A stage holding this layer without that one keeps a
	// copy of them.
	Tied, TiedParams int
	// OutElems is the number of output values per sample: what a stage
	// ending with this layer sends forward per sample, and receives back as
	// its gradient.
	OutElems int
}

// Layers lists the layers of model name in forward order, without
// allocating device memory: NewStage takes ranges of this list.
func Layers(name string, cfg Config) ([]LayerInfo, error) {
	a, err := archFor(name, cfg)
	if err != nil {
		return nil, err
	}
	ls := a.layers()
	infos := make([]LayerInfo, len(ls))
	in := a.input
	for i, l := range ls {
		out, err := l.OutShape(in)
		if err != nil {
			return nil, fmt.Errorf("model: %s layer %d: %w", name, i, err)
		}
		info := LayerInfo{Describe: l.Describe(), Tied: -1, OutElems: numel(out)}
		for _, p := range l.Params() {
			info.Params += numel(p.Shape)
		}
		if h, ok := l.(*TiedHead); ok {
			info.Tied = slices.Index(ls, Layer(h.emb))
			info.TiedParams = h.emb.Vocab * h.emb.D
		}
		infos[i] = info
		in = out
	}
	return infos, nil
}

// LayerTime is one layer's measured compute time on one batch.
type LayerTime struct {
	Forward, Backward time.Duration
}

// ProfileLayers times every layer's forward and backward pass (training
// mode) on b, on the model's one device, waiting for the device after each
// layer: one untimed pass, then reps timed ones, of which it returns each
// layer's median. The loss and its gradient are counted in the last
// layer's times. Parameters and gradients are left as they were, except
// the gradients on the device.
func (m *Model) ProfileLayers(b Batch, reps int) ([]LayerTime, error) {
	if err := m.whole(); err != nil {
		return nil, err
	}
	r, err := m.stageReplica()
	if err != nil {
		return nil, err
	}
	if reps < 1 {
		return nil, fmt.Errorf("model: profiling with %d repetitions, want at least 1", reps)
	}
	if err := m.checkBatch(b); err != nil {
		return nil, err
	}
	L := len(r.layers)
	fwd := make([][]time.Duration, L)
	bwd := make([][]time.Duration, L)
	n := m.samples(b)
	for rep := range reps + 1 {
		x := r.x.get(n)
		r.dev.CopyToDevice(x.Buf, b.X)
		if err := m.synchronize(); err != nil {
			return nil, err
		}
		for i, l := range r.layers {
			t0 := time.Now()
			x = l.Forward(x, true)
			if i == L-1 {
				r.lossStats(m, x, b.Y)
			}
			if err := m.synchronize(); err != nil {
				return nil, err
			}
			if rep > 0 {
				fwd[i] = append(fwd[i], time.Since(t0))
			}
		}
		t0 := time.Now()
		dy := r.lossGrad(m, 1/float32(r.rows))
		for i := L - 1; i >= 0; i-- {
			dy = r.layers[i].Backward(dy)
			if err := m.synchronize(); err != nil {
				return nil, err
			}
			if rep > 0 {
				bwd[i] = append(bwd[i], time.Since(t0))
			}
			t0 = time.Now()
		}
	}
	out := make([]LayerTime, L)
	for i := range out {
		out[i] = LayerTime{Forward: median(fwd[i]), Backward: median(bwd[i])}
	}
	return out, nil
}

// median returns the median of ds (the lower middle one for an even count).
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// RandomBatch returns n samples drawn from seed: uniform token IDs for gpt,
// standard normal inputs for the others, and uniform labels. A step's
// speed does not depend on the values: timings and tests use it.
func (m *Model) RandomBatch(n int, seed uint64) Batch {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	b := Batch{X: make([]float32, n*numel(m.arch.input)), Y: make([]uint8, n*m.arch.positions)}
	for i := range b.X {
		if m.arch.tokens > 0 {
			b.X[i] = float32(rng.IntN(m.arch.tokens))
		} else {
			b.X[i] = float32(rng.NormFloat64())
		}
	}
	for i := range b.Y {
		b.Y[i] = uint8(rng.IntN(m.arch.classes))
	}
	return b
}
