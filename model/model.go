package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/internal/finite"
)

// DefaultBucketBytes is the default fusion-bucket size: 1 MiB of fp32 values.
const DefaultBucketBytes = 1 << 20

// DefaultMaxBatch is the per-device batch capacity when Config.MaxBatch is 0.
const DefaultMaxBatch = 256

// ErrUnknownModel reports a model name New does not know.
var ErrUnknownModel = errors.New("model: unknown model")

// Config configures a model's architecture and memory layout.
type Config struct {
	// Hidden lists the mlp's hidden widths (default 1024, 1024).
	Hidden []int
	// Dropout before the last dense layer (0 = none).
	Dropout float32
	// BucketBytes is the fusion-bucket size in bytes (default DefaultBucketBytes);
	// a tensor larger than a bucket gets a bucket of its own.
	BucketBytes int
	// MaxBatch is the largest batch a device replica will be given (default
	// DefaultMaxBatch), in samples (for gpt: windows of Context tokens);
	// activations are allocated for it once.
	MaxBatch int
	// GPT configures the "gpt" model (the other models ignore it; gpt
	// ignores Hidden and Dropout).
	GPT GPTConfig
}

// Names lists the models New knows.
func Names() []string { return []string{"cnn", "gpt", "mlp"} }

// arch is a model's layers for one replica, plus the sample shape it takes.
type arch struct {
	input   []int
	classes int
	// positions is the number of labels per sample (1 for a classifier,
	// Context for gpt): the network's output is positions × classes logits.
	positions int
	// tokens, when positive, says the input values are token IDs, integers
	// in [0, tokens).
	tokens int
	layers func() []Layer
}

func archFor(name string, cfg Config) (arch, error) {
	switch name {
	case "mlp":
		hidden := cfg.Hidden
		if len(hidden) == 0 {
			hidden = []int{1024, 1024}
		}
		for _, h := range hidden {
			if h <= 0 {
				return arch{}, fmt.Errorf("model: mlp hidden width %d must be positive", h)
			}
		}
		return arch{input: []int{784}, classes: 10, positions: 1, layers: func() []Layer {
			var ls []Layer
			in := 784
			for i, h := range hidden {
				if i == len(hidden)-1 && cfg.Dropout > 0 {
					ls = append(ls, NewLinear(in, h), NewReLU(), NewDropout(cfg.Dropout))
				} else {
					ls = append(ls, NewLinear(in, h), NewReLU())
				}
				in = h
			}
			out := NewLinear(in, 10)
			out.Xavier = true
			return append(ls, out)
		}}, nil
	case "cnn":
		return arch{input: []int{28, 28, 1}, classes: 10, positions: 1, layers: func() []Layer {
			ls := []Layer{
				NewConv2d(1, 32, 3, 1, 1), NewReLU(), NewMaxPool2d(2, 2),
				NewConv2d(32, 64, 3, 1, 1), NewReLU(), NewMaxPool2d(2, 2),
				NewFlatten(), NewLinear(7*7*64, 128), NewReLU(),
			}
			if cfg.Dropout > 0 {
				ls = append(ls, NewDropout(cfg.Dropout))
			}
			out := NewLinear(128, 10)
			out.Xavier = true
			return append(ls, out)
		}}, nil
	case "gpt":
		return gptArch(cfg.GPT)
	}
	return arch{}, fmt.Errorf("%w %q (valid: %s)", ErrUnknownModel, name, strings.Join(Names(), ", "))
}

// TensorInfo locates one parameter tensor in the flat parameter vector.
type TensorInfo struct {
	// Name is "<layer index>.<layer description>.<param name>".
	Name string
	// Shape as the layer uses it; Matrix is the low-rank view (out × rest, or [n]).
	Shape, Matrix []int
	// Offset within the bucket and Len, in elements.
	Offset, Len int
	// Decay says whether weight decay applies.
	Decay bool
	// Init and fans, for initialisation.
	spec ParamSpec
	// layer is the index of the tensor's layer in the model's (or stage's)
	// own layer list; key selects its initialisation stream (its index in
	// the whole network's forward order of tensors, so that a pipeline
	// stage draws the same values as the whole model).
	layer, key int
}

// Bucket is a fusion bucket: a contiguous range of the flat parameter and
// gradient vectors holding whole tensors, in backward order.
type Bucket struct {
	Index int
	// Offset and Len locate the bucket in the flat vectors, in elements.
	Offset, Len int
	// Tensors in the bucket, in order.
	Tensors []TensorInfo
	// readyAfter is the layer whose backward completes the bucket.
	readyAfter int
}

// Shapes returns the bucket's tensor shapes for a codec layout: weights as
// out × rest matrices (conv kernels included), vectors as [n].
func (b Bucket) Shapes() [][]int {
	s := make([][]int, len(b.Tensors))
	for i, t := range b.Tensors {
		s[i] = slices.Clone(t.Matrix)
	}
	return s
}

// Model is a network with a host-side master copy of its parameters and one
// replica per local device. Parameters and gradients are flat fp32 vectors
// split into fusion buckets in backward order (the last layer's tensors
// first). The optimizer updates the host parameters and the model copies
// them to every replica, so replicas on any device kind stay identical.
//
// A Model is not safe for concurrent use.
type Model struct {
	name string
	cfg  Config
	arch arch
	// lo and hi are the range of the network's total layers this model
	// holds: 0 and total for a whole model, a sub-range for a pipeline
	// stage (NewStage); out is the per-sample shape of layer hi-1's output.
	lo, hi, total int
	out           []int
	// tiedKey is the key of the tensor a stage shares with another stage
	// (TiedRange), or -1.
	tiedKey  int
	descs    []string
	buckets  []Bucket
	params   []float32
	grads    []float32
	replicas []*replica
	maxBatch int
}

// replica is the model on one device.
type replica struct {
	dev     gpu.Device
	layers  []Layer
	pbuf    []gpu.Buffer // per bucket
	gbuf    []gpu.Buffer // per bucket
	staging []float32    // host gradients when several replicas are reduced
	x       *act
	labels  *act
	probs   *act
	loss    *act
	dlogits *act
	dy      *act // a pipeline stage's output gradient (stages but the last)
	rows    int  // labels of the latest forward pass (samples for a stage but the last)
	hostY   []float32
	hostL   []float32
	hostP   []float32
	byLayer [][]int // buckets completed by each layer's backward
}

// New builds model name ("mlp", "cnn", "gpt") with one replica per device,
// initialised deterministically from seed (the same seed gives the same
// parameters on every peer and device).
func New(name string, cfg Config, devs []gpu.Device, seed uint64) (*Model, error) {
	return newModel(name, cfg, devs, seed, 0, -1)
}

// newModel builds layers [lo, hi) of model name (hi < 0: to the end).
func newModel(name string, cfg Config, devs []gpu.Device, seed uint64, lo, hi int) (*Model, error) {
	a, err := archFor(name, cfg)
	if err != nil {
		return nil, err
	}
	if len(devs) == 0 {
		return nil, errors.New("model: no devices")
	}
	if cfg.BucketBytes == 0 {
		cfg.BucketBytes = DefaultBucketBytes
	}
	if cfg.BucketBytes < 4 {
		return nil, fmt.Errorf("model: bucket size %d bytes is less than one fp32 value", cfg.BucketBytes)
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.MaxBatch < 0 {
		return nil, fmt.Errorf("model: max batch %d must be positive", cfg.MaxBatch)
	}
	m := &Model{name: name, cfg: cfg, maxBatch: cfg.MaxBatch}
	keys, err := m.cut(a, lo, hi)
	if err != nil {
		return nil, err
	}
	if err := m.layout(m.arch.layers(), keys); err != nil {
		return nil, err
	}
	m.params = make([]float32, m.NumParams())
	m.grads = make([]float32, m.NumParams())
	m.initParams(seed)
	for _, d := range devs {
		r, err := m.newReplica(d)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.replicas = append(m.replicas, r)
	}
	m.syncReplicas()
	return m, nil
}

// layout assigns every parameter tensor to a bucket, in backward order;
// keys[i][j] is the initialisation key of layer i's tensor j.
func (m *Model) layout(layers []Layer, keys [][]int) error {
	in := m.arch.input
	for i, l := range layers {
		out, err := l.OutShape(in)
		if err != nil {
			return fmt.Errorf("model: %s layer %d: %w", m.name, m.lo+i, err)
		}
		m.descs = append(m.descs, l.Describe())
		in = out
	}
	m.out = in
	if want := m.arch.positions * m.arch.classes; m.hi == m.total && numel(in) != want {
		return fmt.Errorf("model: %s ends in %v, want %d logits", m.name, in, want)
	}
	limit := m.cfg.BucketBytes / 4
	var cur *Bucket
	off := 0
	for li := len(layers) - 1; li >= 0; li-- {
		for pi, p := range layers[li].Params() {
			n := numel(p.Shape)
			if cur == nil || (cur.Len > 0 && cur.Len+n > limit) {
				if cur != nil {
					m.buckets = append(m.buckets, *cur)
				}
				cur = &Bucket{Index: len(m.buckets), Offset: off}
			}
			cur.Tensors = append(cur.Tensors, TensorInfo{
				Name:  fmt.Sprintf("%d.%s.%s", m.lo+li, layers[li].Describe(), p.Name),
				Shape: slices.Clone(p.Shape), Matrix: p.Matrix(),
				Offset: cur.Len, Len: n, Decay: p.Decay, spec: p, layer: li, key: keys[li][pi],
			})
			cur.Len += n
			cur.readyAfter = li
			off += n
		}
	}
	if cur != nil {
		m.buckets = append(m.buckets, *cur)
	}
	return nil
}

// initParams fills the host parameters from seed: the k-th tensor of the
// whole network in forward order of (layer, param) draws from a splitmix64
// stream keyed by (seed, k), so the values depend neither on the bucket size
// nor on the pipeline stage holding the tensor.
func (m *Model) initParams(seed uint64) {
	for _, b := range m.buckets {
		for _, t := range b.Tensors {
			m.initTensor(m.params[b.Offset+t.Offset:b.Offset+t.Offset+t.Len], t, seed)
		}
	}
}

// initTensor fills dst, tensor t's values, from seed.
func (m *Model) initTensor(dst []float32, t TensorInfo, seed uint64) {
	sp := t.spec
	switch sp.Init {
	case InitZero:
		clear(dst)
	case InitOne:
		for i := range dst {
			dst[i] = 1
		}
	case InitHe, InitXavier, InitUniformStd:
		bound := math.Sqrt(6 / float64(sp.FanIn))
		switch sp.Init {
		case InitXavier:
			bound = math.Sqrt(6 / float64(sp.FanIn+sp.FanOut))
		case InitUniformStd:
			bound = math.Sqrt(3) * sp.Std
		}
		key := seed ^ (uint64(t.key+1) * 0xd1342543de82ef95)
		for i := range dst {
			u := float64(gpu.Uniform(key, uint64(i))) // in [0, 1), 24 bits: exact
			dst[i] = float32((2*u - 1) * bound)
		}
	}
}

func (m *Model) newReplica(d gpu.Device) (*replica, error) {
	r := &replica{dev: d, layers: m.arch.layers()}
	fail := func(err error) (*replica, error) {
		r.free()
		return nil, fmt.Errorf("model: %s replica on %s: %w", m.name, d.Name(), err)
	}
	for _, b := range m.buckets {
		pb, err := d.Alloc(b.Len)
		if err != nil {
			return fail(err)
		}
		r.pbuf = append(r.pbuf, pb)
		gb, err := d.Alloc(b.Len)
		if err != nil {
			return fail(err)
		}
		r.gbuf = append(r.gbuf, gb)
	}
	// Bind each layer's tensors to views of its buckets.
	type views struct{ p, g []gpu.Buffer }
	bind := make([]views, len(r.layers))
	for bi, b := range m.buckets {
		for _, t := range b.Tensors {
			v := &bind[t.layer]
			v.p = append(v.p, d.View(r.pbuf[bi], t.Offset, t.Len))
			v.g = append(v.g, d.View(r.gbuf[bi], t.Offset, t.Len))
		}
	}
	r.byLayer = make([][]int, len(r.layers))
	for _, b := range m.buckets {
		r.byLayer[b.readyAfter] = append(r.byLayer[b.readyAfter], b.Index)
	}
	in := m.arch.input
	for i, l := range r.layers {
		// A stage's first layer computes its input gradient for the stage before.
		if err := l.Setup(d, m.maxBatch, in, i > 0 || m.lo > 0); err != nil {
			return fail(err)
		}
		l.Bind(bind[i].p, bind[i].g)
		in, _ = l.OutShape(in)
	}
	var err error
	c, pos := m.arch.classes, m.arch.positions
	type actSpec struct {
		dst   **act
		shape []int
	}
	// The last layers end in the loss; a stage before them takes its
	// output's gradient from the next stage.
	acts := []actSpec{{&r.x, m.arch.input}, {&r.dy, m.out}}
	if m.hi == m.total {
		acts = []actSpec{{&r.x, m.arch.input}, {&r.labels, []int{pos}}, {&r.probs, []int{pos, c}}, {&r.loss, []int{pos}}, {&r.dlogits, []int{pos, c}}}
	}
	for _, a := range acts {
		if *a.dst, err = newAct(d, m.maxBatch, a.shape); err != nil {
			return fail(err)
		}
	}
	r.hostY = make([]float32, m.maxBatch*pos)
	r.hostL = make([]float32, m.maxBatch*pos)
	r.hostP = make([]float32, m.maxBatch*pos*c)
	return r, nil
}

func (r *replica) free() {
	for _, l := range r.layers {
		l.Free()
	}
	for _, b := range append(r.pbuf, r.gbuf...) {
		r.dev.Free(b)
	}
	for _, a := range []*act{r.x, r.labels, r.probs, r.loss, r.dlogits, r.dy} {
		a.free()
	}
	r.pbuf, r.gbuf = nil, nil
}

// Close releases every replica's device memory.
func (m *Model) Close() {
	for _, r := range m.replicas {
		r.free()
	}
	m.replicas = nil
}

// Name returns the model's name.
func (m *Model) Name() string { return m.name }

// Devices returns the replicas' devices, in order.
func (m *Model) Devices() []gpu.Device {
	ds := make([]gpu.Device, len(m.replicas))
	for i, r := range m.replicas {
		ds[i] = r.dev
	}
	return ds
}

// InputShape returns the per-sample input shape ([784], [28, 28, 1], or
// [Context] token IDs for gpt).
func (m *Model) InputShape() []int { return slices.Clone(m.arch.input) }

// LabelsPerSample returns the number of labels a sample carries: 1 for the
// classifiers (mlp, cnn), Context for gpt (the next token at every position).
func (m *Model) LabelsPerSample() int { return m.arch.positions }

// Classes returns the number of classes a label takes (the vocabulary for gpt).
func (m *Model) Classes() int { return m.arch.classes }

// MaxBatch returns the largest per-device batch.
func (m *Model) MaxBatch() int { return m.maxBatch }

// NumParams returns the number of parameters.
func (m *Model) NumParams() int {
	n := 0
	for _, b := range m.buckets {
		n += b.Len
	}
	return n
}

// Buckets returns the fusion buckets in backward order.
func (m *Model) Buckets() []Bucket { return slices.Clone(m.buckets) }

// Signature describes the architecture and layout (layers, tensors, buckets);
// two models with equal signatures have interchangeable parameter vectors.
func (m *Model) Signature() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s[%s]", m.name, strings.Join(m.descs, " "))
	for _, b := range m.buckets {
		fmt.Fprintf(&sb, " bucket%d{", b.Index)
		for i, t := range b.Tensors {
			if i > 0 {
				sb.WriteByte(' ')
			}
			fmt.Fprintf(&sb, "%s%v", t.Name, t.Shape)
		}
		sb.WriteByte('}')
	}
	return sb.String()
}

// Params returns the host parameter vector (not a copy). After changing it,
// call SyncReplicas.
func (m *Model) Params() []float32 { return m.params }

// Grads returns the host gradient vector (not a copy): ComputeGradients
// writes each bucket's averaged local gradient there; the step loop reduces
// it across peers in place before ApplyGradients.
func (m *Model) Grads() []float32 { return m.grads }

// BucketParams returns bucket b's slice of Params.
func (m *Model) BucketParams(b int) []float32 {
	bk := m.buckets[b]
	return m.params[bk.Offset : bk.Offset+bk.Len]
}

// BucketGrads returns bucket b's slice of Grads.
func (m *Model) BucketGrads(b int) []float32 {
	bk := m.buckets[b]
	return m.grads[bk.Offset : bk.Offset+bk.Len]
}

// SyncReplicas copies the host parameters to every replica.
func (m *Model) SyncReplicas() { m.syncReplicas() }

func (m *Model) syncReplicas() {
	for _, r := range m.replicas {
		for i, b := range m.buckets {
			r.dev.CopyToDevice(r.pbuf[i], m.params[b.Offset:b.Offset+b.Len])
		}
	}
}

// CheckReplicas verifies that every replica's parameters equal the host
// copy bit for bit.
func (m *Model) CheckReplicas() error {
	buf := make([]float32, 0)
	for _, r := range m.replicas {
		for i, b := range m.buckets {
			buf = slices.Grow(buf[:0], b.Len)[:b.Len]
			r.dev.CopyToHost(buf, r.pbuf[i])
			for j, v := range buf {
				if math.Float32bits(v) != math.Float32bits(m.params[b.Offset+j]) {
					return fmt.Errorf("model: replica on %s: bucket %d element %d is %v, host has %v", r.dev.Name(), i, j, v, m.params[b.Offset+j])
				}
			}
		}
	}
	return nil
}

// ParamBytes returns the parameters as little-endian fp32 bytes, in flat order.
func (m *Model) ParamBytes() []byte { return FloatBytes(m.params) }

// SetParamBytes replaces the parameters with little-endian fp32 bytes (as
// ParamBytes makes them) and copies them to every replica.
func (m *Model) SetParamBytes(p []byte) error {
	if len(p) != 4*len(m.params) {
		return fmt.Errorf("model: %s parameter state is %d bytes, want %d", m.name, len(p), 4*len(m.params))
	}
	BytesToFloats(m.params, p)
	m.syncReplicas()
	return nil
}

// ParamHash returns the hex SHA-256 of ParamBytes.
func (m *Model) ParamHash() string { return HashFloats(m.params) }

// HashFloats returns the hex SHA-256 of v as little-endian fp32 bytes.
func HashFloats(v []float32) string {
	h := sha256.New()
	var buf [4096]byte
	for len(v) > 0 {
		n := min(len(v), len(buf)/4)
		for i, x := range v[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
		}
		h.Write(buf[:4*n])
		v = v[n:]
	}
	return hex.EncodeToString(h.Sum(nil))
}

// FloatBytes returns v as little-endian fp32 bytes (the layout of
// checkpoints and parameter states).
func FloatBytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// BytesToFloats fills dst from little-endian fp32 bytes b (FloatBytes's
// layout); b must hold at least 4·len(dst) bytes.
func BytesToFloats(dst []float32, b []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// Batch is one device's share of a step: N samples of the model's input
// shape (X holds N·numel(InputShape) values) and their class labels,
// LabelsPerSample a sample (Y holds N·LabelsPerSample values). For gpt, X
// holds N windows of Context token IDs (exact integers as float32) and Y
// the token that follows each of them.
type Batch struct {
	X []float32
	Y []uint8
}

// N returns the number of labels: the number of samples for a model with
// one label per sample (mlp, cnn), samples·Context for gpt.
func (b Batch) N() int { return len(b.Y) }

// Stats summarises a forward pass.
type Stats struct {
	// Loss is the mean cross-entropy per label, in nats.
	Loss float64
	// Correct counts labels whose arg-max logit is the label.
	Correct int
	// Samples counts labels (samples for mlp and cnn, tokens for gpt).
	Samples int
}

// Accuracy returns Correct/Samples (0 for no samples).
func (s Stats) Accuracy() float64 {
	if s.Samples == 0 {
		return 0
	}
	return float64(s.Correct) / float64(s.Samples)
}

// Add merges o into s: the losses weighted by their label counts.
func (s *Stats) Add(o Stats) {
	if o.Samples == 0 {
		return
	}
	tot := s.Samples + o.Samples
	s.Loss = (s.Loss*float64(s.Samples) + o.Loss*float64(o.Samples)) / float64(tot)
	s.Correct += o.Correct
	s.Samples = tot
}

// samples returns the number of samples in b (labels over LabelsPerSample).
func (m *Model) samples(b Batch) int { return len(b.Y) / m.arch.positions }

func (m *Model) checkBatch(b Batch) error {
	pos := m.arch.positions
	if len(b.Y)%pos != 0 {
		return fmt.Errorf("model: batch has %d labels, not a multiple of the %d per sample", len(b.Y), pos)
	}
	n := m.samples(b)
	if err := m.checkInput(b.X, n); err != nil {
		return err
	}
	return m.checkLabels(b.Y)
}

// checkInput checks n samples of input x: their count, length and, for
// token IDs, values.
func (m *Model) checkInput(x []float32, n int) error {
	if n <= 0 || n > m.maxBatch {
		return fmt.Errorf("model: batch of %d samples (want 1..%d)", n, m.maxBatch)
	}
	if per := numel(m.arch.input); len(x) != n*per {
		return fmt.Errorf("model: batch has %d input values for %d samples of %d", len(x), n, per)
	}
	if v := m.arch.tokens; v > 0 {
		per := numel(m.arch.input)
		for i, t := range x {
			if _, ok := gpu.TokenIndex(t, v); !ok {
				return fmt.Errorf("model: sample %d position %d has token %v, want an integer in [0, %d)", i/per, i%per, t, v)
			}
		}
	}
	return nil
}

// checkLabels checks that every label names a class.
func (m *Model) checkLabels(ys []uint8) error {
	pos := m.arch.positions
	for i, y := range ys {
		if int(y) >= m.arch.classes {
			if pos > 1 {
				return fmt.Errorf("model: sample %d position %d has label %d, want < %d", i/pos, i%pos, y, m.arch.classes)
			}
			return fmt.Errorf("model: sample %d has label %d, want < %d", i, y, m.arch.classes)
		}
	}
	return nil
}

// forward runs the replica on b up to the loss and returns the stats.
func (r *replica) forward(m *Model, b Batch, train bool, seed uint64) Stats {
	return r.lossStats(m, r.run(m, b.X, m.samples(b), train, seed), b.Y)
}

// run copies n samples of input x to the device and runs the layers on
// them, random layers seeded from seed and their index in the whole network.
func (r *replica) run(m *Model, xs []float32, n int, train bool, seed uint64) Tensor {
	x := r.x.get(n)
	r.dev.CopyToDevice(x.Buf, xs)
	for i, l := range r.layers {
		if s, ok := l.(seeder); ok {
			s.SetSeed(MixSeed(seed, uint64(m.lo+i)))
		}
		x = l.Forward(x, train)
	}
	r.rows = n
	return x
}

// lossStats computes the loss of the logits x (the last layer's output) for the
// labels ys and returns the stats; backward starts from it.
func (r *replica) lossStats(m *Model, x Tensor, ys []uint8) Stats {
	n := x.Batch()
	rows := len(ys) // labels: n·positions
	for i, y := range ys {
		r.hostY[i] = float32(y)
	}
	lab := r.labels.get(n)
	r.dev.CopyToDevice(lab.Buf, r.hostY[:rows])
	r.rows = rows
	c := m.arch.classes
	probs, loss := r.probs.get(n), r.loss.get(n)
	r.dev.SoftmaxCrossEntropy(probs.Buf, loss.Buf, x.Buf, lab.Buf, rows, c)
	r.dev.CopyToHost(r.hostL[:rows], loss.Buf)
	r.dev.CopyToHost(r.hostP[:rows*c], probs.Buf)
	var st Stats
	var sum float64
	for i := 0; i < rows; i++ {
		sum += float64(r.hostL[i])
		p := r.hostP[i*c : i*c+c]
		best := 0
		for j := 1; j < c; j++ {
			if p[j] > p[best] {
				best = j
			}
		}
		if best == int(ys[i]) {
			st.Correct++
		}
	}
	st.Samples = rows
	st.Loss = sum / float64(rows)
	return st
}

// backward runs the replica's backward pass for the latest forward pass, of
// rows labels; after the layer that completes bucket k it copies the
// bucket's gradients into dst and calls done(k).
func (r *replica) backward(m *Model, rows int, dst []float32, done func(int)) {
	r.backprop(m, r.lossGrad(m, 1/float32(rows)), func(k int) {
		b := m.buckets[k]
		r.dev.CopyToHost(dst[b.Offset:b.Offset+b.Len], r.gbuf[k])
		done(k)
	})
}

// lossGrad returns the gradient of the latest loss, scaled by scale per
// label (the mean over rows labels: 1/rows).
func (r *replica) lossGrad(m *Model, scale float32) Tensor {
	n := r.rows / m.arch.positions
	dz := r.dlogits.get(n)
	r.dev.SoftmaxCrossEntropyBackward(dz.Buf, r.probs.get(n).Buf, r.labels.get(n).Buf, r.rows, m.arch.classes, scale)
	return dz
}

// backprop runs the layers' backward passes from the output gradient dy,
// calls bucket(k) after the layer that completes bucket k in the device's
// gradient buffers, and returns the first layer's input gradient.
func (r *replica) backprop(m *Model, dy Tensor, bucket func(k int)) Tensor {
	for i := len(r.layers) - 1; i >= 0; i-- {
		dy = r.layers[i].Backward(dy)
		for _, k := range r.byLayer[i] {
			bucket(k)
		}
	}
	return dy
}

// MixSeed derives sub-seed k of seed (a splitmix-style finaliser).
func MixSeed(seed, k uint64) uint64 {
	z := seed ^ (k+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9
	return z ^ (z >> 29)
}

// NoiseSeed derives the seed for a step's random layers (dropout) from the
// cluster seed, the step and the rank of the device's batch.
func NoiseSeed(seed uint64, step int64, rank int) uint64 {
	return MixSeed(MixSeed(seed, uint64(step)), uint64(rank))
}

// ComputeGradients runs forward and backward on every replica, replica i on
// batches[i] (len(batches) must equal the number of devices), with random
// layers seeded from MixSeed(noiseSeed, i).
//
// Each replica's gradient is the mean over its batch's labels; the local
// gradient in Grads is their label-weighted average (sample-weighted: every
// sample has LabelsPerSample labels), summed in replica order. As soon as
// bucket k is complete on every replica (buckets complete in order 0, 1, …),
// its slice of Grads is final and ready(k) is called on the calling goroutine,
// while earlier layers are still computing; ready may be nil. ready should
// only hand the bucket to another goroutine (its all-reduce) and return: with
// one device, backward waits for it. Until the next ComputeGradients, the
// caller owns the bucket's slice of Grads (the all-reduce may average in
// place); ready must not touch other buckets' gradients before their call.
//
// It returns the loss and accuracy of the forward pass over all batches, and
// then the devices' deferred errors (*DeviceError): a failed device's
// results are not valid (the CUDA device gives NaN), nor are the buckets
// already handed to ready.
func (m *Model) ComputeGradients(batches []Batch, noiseSeed uint64, ready func(bucket int)) (Stats, error) {
	if err := m.whole(); err != nil {
		return Stats{}, err
	}
	if len(batches) != len(m.replicas) {
		return Stats{}, fmt.Errorf("model: %d batches for %d devices", len(batches), len(m.replicas))
	}
	total := 0
	for i, b := range batches {
		if err := m.checkBatch(b); err != nil {
			return Stats{}, fmt.Errorf("model: device %d: %w", i, err)
		}
		total += b.N()
	}
	if ready == nil {
		ready = func(int) {}
	}
	if len(m.replicas) == 1 {
		r := m.replicas[0]
		st := r.forward(m, batches[0], true, MixSeed(noiseSeed, 0))
		r.backward(m, batches[0].N(), m.grads, ready)
		return st, m.synchronize()
	}
	R := len(m.replicas)
	stats := make([]Stats, R)
	chans := make([]chan int, R)
	var wg sync.WaitGroup
	for i, r := range m.replicas {
		if r.staging == nil {
			r.staging = make([]float32, len(m.grads))
		}
		chans[i] = make(chan int, len(m.buckets))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(chans[i])
			stats[i] = r.forward(m, batches[i], true, MixSeed(noiseSeed, uint64(i)))
			r.backward(m, batches[i].N(), r.staging, func(k int) { chans[i] <- k })
		}()
	}
	w := make([]float32, R)
	for i, b := range batches {
		w[i] = float32(float64(b.N()) / float64(total))
	}
	for k := range m.buckets {
		for i := range chans {
			if got, ok := <-chans[i]; !ok || got != k {
				panic(fmt.Sprintf("model: replica %d reported bucket %d (open %v), want %d", i, got, ok, k))
			}
		}
		b := m.buckets[k]
		g := m.grads[b.Offset : b.Offset+b.Len]
		for i, r := range m.replicas {
			s := r.staging[b.Offset : b.Offset+b.Len]
			if i == 0 {
				for j, v := range s {
					g[j] = float32(w[0] * v)
				}
				continue
			}
			wi := w[i]
			for j, v := range s {
				g[j] += float32(wi * v)
			}
		}
		ready(k)
	}
	wg.Wait()
	var st Stats
	for _, s := range stats {
		st.Add(s)
	}
	return st, m.synchronize()
}

// DeviceError is a failure a device reported (gpu.Device.Synchronize): the
// results of the work that failed are not valid, and the device may not
// recover (a CUDA context is unusable after a kernel fault).
type DeviceError struct {
	Device string // the device's name
	Err    error
}

func (e *DeviceError) Error() string { return fmt.Sprintf("model: device %s: %v", e.Device, e.Err) }

func (e *DeviceError) Unwrap() error { return e.Err }

// synchronize waits for every replica's device and returns the errors they
// deferred, each a *DeviceError.
func (m *Model) synchronize() error {
	var errs []error
	for _, r := range m.replicas {
		if err := r.dev.Synchronize(); err != nil {
			errs = append(errs, &DeviceError{Device: r.dev.Name(), Err: err})
		}
	}
	return errors.Join(errs...)
}

// Samples is a labelled sample set that Evaluate walks in order.
type Samples interface {
	// Len returns the number of samples.
	Len() int
	// SampleLen returns the number of values per sample.
	SampleLen() int
	// Slice returns samples [lo, hi).
	Slice(lo, hi int) Batch
}

// Evaluate runs the model in inference mode over a dataset in batches of up
// to MaxBatch, split across the replicas, and returns the mean loss and the
// accuracy, or the devices' deferred errors (*DeviceError).
func (m *Model) Evaluate(ds Samples) (Stats, error) {
	if err := m.whole(); err != nil {
		return Stats{}, err
	}
	if ds.Len() == 0 {
		return Stats{}, errors.New("model: evaluating on an empty dataset")
	}
	if ds.Len() < 0 {
		return Stats{}, fmt.Errorf("model: evaluating on a dataset of %d samples", ds.Len())
	}
	if per := numel(m.arch.input); ds.SampleLen() != per {
		return Stats{}, fmt.Errorf("model: dataset samples have %d values, model takes %d", ds.SampleLen(), per)
	}
	R := len(m.replicas)
	stats := make([]Stats, R)
	errs := make([]error, R)
	var wg sync.WaitGroup
	for i, r := range m.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Replica i takes chunks i, i+R, i+2R, … ; results are merged in
			// replica order, so the total is deterministic.
			var st Stats
			for lo := i * m.maxBatch; lo < ds.Len(); lo += R * m.maxBatch {
				hi := min(lo+m.maxBatch, ds.Len())
				b := ds.Slice(lo, hi)
				if err := m.checkBatch(b); err != nil {
					errs[i] = fmt.Errorf("model: evaluating samples %d..%d: %w", lo, hi, err)
					return
				}
				st.Add(r.forward(m, b, false, 0))
			}
			stats[i] = st
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Stats{}, errors.Join(err, m.synchronize())
	}
	var st Stats
	for _, s := range stats {
		st.Add(s)
	}
	return st, m.synchronize()
}

// HasNonFinite reports whether v contains a NaN or an infinity.
func HasNonFinite(v []float32) bool { return finite.Has(v) }
