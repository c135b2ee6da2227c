package model

import (
	"fmt"
	"slices"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// A pipeline stage is a Model that holds a contiguous range [lo, hi) of a
// network's layers (NewStage). Its parameters, buckets, optimizer,
// checkpoints and hashes work as a whole model's do, over its own tensors
// only; its tensors keep the names and the initial values they have in the
// whole model. A stage runs one micro-batch at a time through StageForward
// and StageBackward: the first stage takes the samples, the others the
// previous stage's output, and the last one ends in the loss.
//
// A weight shared by layers in different stages (the gpt's token table,
// used by the embedding and the tied head) is held by both stages: the
// stage with the head keeps a copy, initialised like the original, and each
// side computes only its own part of the gradient. The two stages must add
// each other's part (TiedRange locates it) before the optimizer step, so
// that both apply the same sum and stay identical (docs/pipeline.md).

// NewStage builds layers [lo, hi) of model name on dev, initialised
// deterministically from seed: every tensor gets the values it has in
// New(name, cfg, devs, seed). Layers(name, cfg) lists the layers.
func NewStage(name string, cfg Config, dev gpu.Device, seed uint64, lo, hi int) (*Model, error) {
	if dev == nil {
		return nil, fmt.Errorf("model: %s stage [%d, %d): no device", name, lo, hi)
	}
	return newModel(name, cfg, []gpu.Device{dev}, seed, lo, hi)
}

// cut sets m's architecture to layers [lo, hi) of a (hi < 0: all of them)
// and returns the initialisation keys of their tensors.
func (m *Model) cut(a arch, lo, hi int) ([][]int, error) {
	full := a.layers()
	total := len(full)
	if hi < 0 {
		hi = total
	}
	if lo < 0 || lo >= hi || hi > total {
		return nil, fmt.Errorf("model: %s has %d layers: stage [%d, %d) is not a non-empty range of them", m.name, total, lo, hi)
	}
	in := a.input
	for i := range lo {
		out, err := full[i].OutShape(in)
		if err != nil {
			return nil, fmt.Errorf("model: %s layer %d: %w", m.name, i, err)
		}
		in = out
	}
	keys := forwardKeys(full)
	m.lo, m.hi, m.total, m.arch, m.tiedKey = lo, hi, total, a, -1
	if lo == 0 && hi == total {
		return keys, nil
	}
	m.arch.input = in
	if lo > 0 {
		m.arch.tokens = 0 // activations, not token IDs
	}
	m.arch.layers = func() []Layer {
		ls, _, _ := cutLayers(a.layers(), lo, hi, nil)
		return ls
	}
	_, ks, tied := cutLayers(full, lo, hi, keys)
	m.tiedKey = tied
	return ks, nil
}

// forwardKeys numbers the tensors of layers in forward order of (layer,
// param): keys[i][j] is layer i's tensor j.
func forwardKeys(layers []Layer) [][]int {
	keys := make([][]int, len(layers))
	k := 0
	for i, l := range layers {
		for range l.Params() {
			keys[i] = append(keys[i], k)
			k++
		}
	}
	return keys
}

// cutLayers returns layers [lo, hi) of a freshly built network full, with
// every tie to a layer outside the range cut: a tied head whose embedding
// lies outside becomes a copy holding its own table, and an embedding
// whose head lies outside computes only its own part of the table's
// gradient. With keys (forwardKeys(full)) it also returns the stage's
// initialisation keys (a copy takes the original's) and the key of the
// tensor shared with another stage (-1: none).
func cutLayers(full []Layer, lo, hi int, keys [][]int) ([]Layer, [][]int, int) {
	ls := slices.Clone(full[lo:hi])
	var ks [][]int
	if keys != nil {
		ks = slices.Clone(keys[lo:hi])
	}
	inside := func(i int) bool { return i >= lo && i < hi }
	tied := -1
	for j, l := range full {
		h, ok := l.(*TiedHead)
		if !ok {
			continue
		}
		e := slices.Index(full, Layer(h.emb))
		if inside(j) == inside(e) {
			continue
		}
		if keys != nil && e >= 0 {
			tied = keys[e][0]
		}
		if inside(j) {
			ls[j-lo] = h.detached()
			if ks != nil {
				ks[j-lo] = []int{tied}
			}
		} else {
			h.emb.tied = false
		}
	}
	return ls, ks, tied
}

// whole returns an error for a pipeline stage, which cannot compute a
// loss from samples on its own.
func (m *Model) whole() error {
	if m.lo == 0 && m.hi == m.total {
		return nil
	}
	return fmt.Errorf("model: %s stage [%d, %d) of %d layers does not run whole batches: use StageForward and StageBackward", m.name, m.lo, m.hi, m.total)
}

// StageRange returns the layers this model holds, [lo, hi) of total
// ([0, total) for a whole model).
func (m *Model) StageRange() (lo, hi, total int) { return m.lo, m.hi, m.total }

// StageInputShape returns the per-sample shape of the stage's input: the
// model's InputShape for the first stage, else the previous layer's output.
func (m *Model) StageInputShape() []int { return slices.Clone(m.arch.input) }

// StageOutputShape returns the per-sample shape of the stage's output (the
// logits for the last stage).
func (m *Model) StageOutputShape() []int { return slices.Clone(m.out) }

// TiedRange returns where, in Params and Grads, the stage holds its side of
// a weight shared with another stage (the first stage's token table when
// the tied head is elsewhere, the last stage's copy of it), and whether it
// holds one. Both stages hold it at the same key and size.
func (m *Model) TiedRange() (off, n int, ok bool) {
	if m.tiedKey < 0 {
		return 0, 0, false
	}
	for _, b := range m.buckets {
		for _, t := range b.Tensors {
			if t.key == m.tiedKey {
				return b.Offset + t.Offset, t.Len, true
			}
		}
	}
	return 0, 0, false
}

// StageInput is one micro-batch for StageForward.
type StageInput struct {
	// N is the number of samples.
	N int
	// X holds N·numel(StageInputShape) values: the samples for the first
	// stage (token IDs for gpt), the previous stage's output otherwise.
	X []float32
	// Y holds the labels, N·LabelsPerSample of them; only the last stage
	// reads them.
	Y []uint8
	// Train selects training behaviour (dropout); NoiseSeed seeds the
	// random layers, with each layer's index in the whole network.
	Train     bool
	NoiseSeed uint64
}

// StageForward runs the stage's layers on one micro-batch. The last stage
// computes the loss and returns its stats; the others write their output,
// N·numel(StageOutputShape) values, into out. StageBackward goes back
// through the latest StageForward. It returns the device's deferred error
// (*DeviceError) after the work.
func (m *Model) StageForward(in StageInput, out []float32) (Stats, error) {
	r, err := m.stageReplica()
	if err != nil {
		return Stats{}, err
	}
	if err := m.checkInput(in.X, in.N); err != nil {
		return Stats{}, fmt.Errorf("model: %s stage [%d, %d): %w", m.name, m.lo, m.hi, err)
	}
	last := m.hi == m.total
	if last {
		if want := in.N * m.arch.positions; len(in.Y) != want {
			return Stats{}, fmt.Errorf("model: %s last stage: %d labels for %d samples, want %d", m.name, len(in.Y), in.N, want)
		}
		if err := m.checkLabels(in.Y); err != nil {
			return Stats{}, err
		}
	} else if want := in.N * numel(m.out); len(out) != want {
		return Stats{}, fmt.Errorf("model: %s stage [%d, %d): output buffer of %d values for %d samples, want %d", m.name, m.lo, m.hi, len(out), in.N, want)
	}
	x := r.run(m, in.X, in.N, in.Train, in.NoiseSeed)
	var st Stats
	if last {
		st = r.lossStats(m, x, in.Y)
	} else {
		r.dev.CopyToHost(out, x.Buf)
	}
	return st, m.synchronize()
}

// StageBackward runs the backward pass of the latest StageForward. The last
// stage starts from its loss, each label's gradient scaled by scale (1 over
// the number of labels the mean runs over: the whole batch's, not the
// micro-batch's, for the gradient of the batch mean); the others start from
// dy, the gradient of their output. Stages but the first write the gradient
// of their input into dx (N·numel(StageInputShape) values); the first takes
// nil. The parameter gradients replace Grads, or are added to them with
// accumulate (for the micro-batches after the first), one bucket at a time
// in backward order, calling ready(k) once bucket k is in Grads (ready may
// be nil).
func (m *Model) StageBackward(dy []float32, scale float32, dx []float32, accumulate bool, ready func(bucket int)) error {
	r, err := m.stageReplica()
	if err != nil {
		return err
	}
	if r.rows == 0 {
		return fmt.Errorf("model: %s stage [%d, %d): backward pass without a forward pass", m.name, m.lo, m.hi)
	}
	last := m.hi == m.total
	n := r.rows
	if last {
		n /= m.arch.positions
	} else if want := n * numel(m.out); len(dy) != want {
		return fmt.Errorf("model: %s stage [%d, %d): output gradient of %d values for %d samples, want %d", m.name, m.lo, m.hi, len(dy), n, want)
	}
	if want := n * numel(m.arch.input); m.lo > 0 && len(dx) != want {
		return fmt.Errorf("model: %s stage [%d, %d): input gradient buffer of %d values for %d samples, want %d", m.name, m.lo, m.hi, len(dx), n, want)
	}
	var g Tensor
	if last {
		g = r.lossGrad(m, scale)
	} else {
		g = r.dy.get(n)
		r.dev.CopyToDevice(g.Buf, dy)
	}
	if accumulate && r.staging == nil {
		r.staging = make([]float32, len(m.grads))
	}
	d := r.backprop(m, g, func(k int) {
		b := m.buckets[k]
		dst := m.grads[b.Offset : b.Offset+b.Len]
		if !accumulate {
			r.dev.CopyToHost(dst, r.gbuf[k])
		} else {
			s := r.staging[b.Offset : b.Offset+b.Len]
			r.dev.CopyToHost(s, r.gbuf[k])
			for j, v := range s {
				dst[j] += v
			}
		}
		if ready != nil {
			ready(k)
		}
	})
	if m.lo > 0 {
		r.dev.CopyToHost(dx, d.Buf)
	}
	return m.synchronize()
}

// stageReplica returns the replica the stage API runs on.
func (m *Model) stageReplica() (*replica, error) {
	if len(m.replicas) != 1 {
		return nil, fmt.Errorf("model: %s: the stage API runs on one device, the model has %d", m.name, len(m.replicas))
	}
	return m.replicas[0], nil
}
