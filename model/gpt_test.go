package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// tinyGPT is the configuration of the gradient and mask tests.
var tinyGPT = GPTConfig{Layers: 2, DModel: 16, Heads: 2, Context: 8, Vocab: 32}

func newGPT(t *testing.T, c GPTConfig, maxBatch, devs int, seed uint64) *Model {
	t.Helper()
	var ds []gpu.Device
	for i := range devs {
		ds = append(ds, gpu.NewCPU(i))
	}
	m, err := New("gpt", Config{GPT: c, MaxBatch: maxBatch}, ds, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// randomTokens returns a batch of n windows of random tokens and labels.
func randomTokens(rng *rand.Rand, c GPTConfig, n int) Batch {
	b := Batch{X: make([]float32, n*c.Context), Y: make([]uint8, n*c.Context)}
	for i := range b.X {
		b.X[i] = float32(rng.IntN(c.Vocab))
		b.Y[i] = uint8(rng.IntN(c.Vocab))
	}
	return b
}

// perturb adds noise of standard deviation std to every parameter, so that
// biases, LayerNorm shifts and scales and attention patterns are generic.
func perturb(m *Model, seed uint64, std float64) {
	rng := rand.New(rand.NewPCG(seed, 3))
	for i := range m.Params() {
		m.Params()[i] += float32(rng.NormFloat64() * std)
	}
	m.SyncReplicas()
}

func TestGPTConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  GPTConfig
		want string
	}{
		{GPTConfig{Layers: -1}, "Layers"},
		{GPTConfig{DModel: -8}, "DModel"},
		{GPTConfig{Heads: -2}, "Heads"},
		{GPTConfig{Context: -1}, "Context"},
		{GPTConfig{Vocab: -3}, "Vocab"},
		{GPTConfig{Vocab: 257}, "Vocab"},
		{GPTConfig{DModel: 30, Heads: 4}, "DModel 30 is not a multiple of Heads 4"},
	} {
		m, err := New("gpt", Config{GPT: tc.cfg, MaxBatch: 2}, []gpu.Device{gpu.NewCPU(0)}, 1)
		if err == nil {
			m.Close()
			t.Errorf("New(gpt, %+v) succeeded", tc.cfg)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "model: gpt ") {
			t.Errorf("New(gpt, %+v) = %v, want an error naming %q", tc.cfg, err, tc.want)
		}
	}
}

// TestGPTLayout checks the default size, the parameter count formula, the
// tensors' shapes and decay flags, and that the tied head adds no tensor.
func TestGPTLayout(t *testing.T) {
	c, err := GPTConfig{}.Resolved()
	if err != nil {
		t.Fatal(err)
	}
	if c != (GPTConfig{Layers: 4, DModel: 256, Heads: 4, Context: 128, Vocab: 256}) {
		t.Errorf("defaults %+v", c)
	}
	if n := c.NumParams(); n != 3257856 {
		t.Errorf("default NumParams = %d, want 3257856", n)
	}
	m := newGPT(t, tinyGPT, 2, 1, 1)
	if m.NumParams() != tinyGPT.NumParams() {
		t.Errorf("model has %d parameters, formula %d", m.NumParams(), tinyGPT.NumParams())
	}
	if m.LabelsPerSample() != 8 || m.Classes() != 32 || !slices.Equal(m.InputShape(), []int{8}) {
		t.Errorf("LabelsPerSample %d Classes %d InputShape %v", m.LabelsPerSample(), m.Classes(), m.InputShape())
	}
	want := map[string]struct {
		matrix []int
		decay  bool
	}{
		"wte": {[]int{32, 16}, true}, "wpe": {[]int{8, 16}, true},
		"ln1.gamma": {[]int{16}, false}, "ln1.beta": {[]int{16}, false},
		"attn.qkv.weight": {[]int{48, 16}, true}, "attn.qkv.bias": {[]int{48}, false},
		"attn.proj.weight": {[]int{16, 16}, true}, "attn.proj.bias": {[]int{16}, false},
		"ln2.gamma": {[]int{16}, false}, "ln2.beta": {[]int{16}, false},
		"fc1.weight": {[]int{64, 16}, true}, "fc1.bias": {[]int{64}, false},
		"fc2.weight": {[]int{16, 64}, true}, "fc2.bias": {[]int{16}, false},
		"gamma": {[]int{16}, false}, "beta": {[]int{16}, false},
	}
	seen := map[string]int{}
	bs := m.Buckets()
	for _, b := range bs {
		for _, ti := range b.Tensors {
			parts := strings.SplitN(ti.Name, ".", 3)
			w, ok := want[parts[2]]
			if !ok || !slices.Equal(ti.Matrix, w.matrix) || ti.Decay != w.decay {
				t.Errorf("tensor %s matrix %v decay %v, want %+v", ti.Name, ti.Matrix, ti.Decay, w)
			}
			seen[parts[2]]++
		}
	}
	if seen["wte"] != 1 || seen["attn.qkv.weight"] != 2 || seen["gamma"] != 1 {
		t.Errorf("tensor counts %v", seen)
	}
	last := bs[len(bs)-1].Tensors
	if !strings.HasSuffix(last[len(last)-1].Name, ".wpe") {
		t.Errorf("the last tensor in backward order is %s, want the position embedding", last[len(last)-1].Name)
	}
}

// TestGPTBatchErrors checks that bad gpt batches are errors, not panics.
func TestGPTBatchErrors(t *testing.T) {
	m := newGPT(t, tinyGPT, 2, 1, 1)
	rng := rand.New(rand.NewPCG(1, 1))
	for _, tc := range []struct {
		name string
		edit func(b *Batch)
		want string
	}{
		{"fractional token", func(b *Batch) { b.X[3] = 1.5 }, "sample 0 position 3 has token 1.5"},
		{"token beyond the vocabulary", func(b *Batch) { b.X[9] = 32 }, "sample 1 position 1 has token 32"},
		{"negative token", func(b *Batch) { b.X[0] = -1 }, "token -1"},
		{"NaN token", func(b *Batch) { b.X[0] = float32(math.NaN()) }, "token NaN"},
		{"label beyond the vocabulary", func(b *Batch) { b.Y[10] = 40 }, "sample 1 position 2 has label 40"},
		{"labels not whole windows", func(b *Batch) { b.Y = b.Y[:15] }, "not a multiple of the 8 per sample"},
		{"inputs and labels disagree", func(b *Batch) { b.X = b.X[:8] }, "8 input values for 2 samples of 8"},
		{"too many samples", func(b *Batch) { *b = randomTokens(rng, tinyGPT, 3) }, "batch of 3 samples"},
	} {
		b := randomTokens(rng, tinyGPT, 2)
		tc.edit(&b)
		if _, err := m.ComputeGradients([]Batch{b}, 0, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// logits runs replica 0 forward on b and returns the network's output.
func logits(t *testing.T, m *Model, b Batch) []float32 {
	t.Helper()
	if err := m.checkBatch(b); err != nil {
		t.Fatal(err)
	}
	r := m.replicas[0]
	x := r.x.get(m.samples(b))
	r.dev.CopyToDevice(x.Buf, b.X)
	for _, l := range r.layers {
		x = l.Forward(x, false)
	}
	out := make([]float32, x.Len())
	r.dev.CopyToHost(out, x.Buf)
	return out
}

// TestGPTCausalMask checks that the logits at positions ≤ t do not depend
// on the tokens after t (bit for bit), while those after t do change.
func TestGPTCausalMask(t *testing.T) {
	c := tinyGPT
	m := newGPT(t, c, 2, 1, 5)
	perturb(m, 5, 0.2)
	rng := rand.New(rand.NewPCG(2, 2))
	b := randomTokens(rng, c, 2)
	base := logits(t, m, b)
	for cut := 0; cut < c.Context-1; cut++ {
		b2 := Batch{X: slices.Clone(b.X), Y: b.Y}
		for s := 0; s < 2; s++ {
			for p := cut + 1; p < c.Context; p++ {
				b2.X[s*c.Context+p] = float32((int(b.X[s*c.Context+p]) + 1 + rng.IntN(c.Vocab-1)) % c.Vocab)
			}
		}
		got := logits(t, m, b2)
		changed := false
		for s := 0; s < 2; s++ {
			for p := 0; p < c.Context; p++ {
				row := (s*c.Context + p) * c.Vocab
				same := slices.Equal(got[row:row+c.Vocab], base[row:row+c.Vocab])
				if p <= cut && !same {
					t.Fatalf("changing tokens after %d changed the logits of sample %d position %d", cut, s, p)
				}
				changed = changed || (p > cut && !same)
			}
		}
		if !changed {
			t.Fatalf("changing tokens after %d changed no later logits", cut)
		}
	}
}

// TestGPTGradient checks the gradient of the whole model's mean loss against
// central differences along one direction per tensor (every tensor of
// every kind: embeddings, LayerNorms, attention and MLP weights and
// biases), and for single elements of the token table, whose gradient
// comes from both the embedding and the tied head.
//
// The forward pass is float32, so the loss carries rounding noise of about
// 1e-6; with a step of eps = 1e-2 along a unit direction that is a noise of
// about 1e-4 in the difference quotient, and the truncation error (eps²
// times the third derivative) is of the same order. The tolerance,
// 5e-4 + 0.5 % of the derivative, is above both and far below the derivative
// itself (checked: at least 1e-2). Observed: relative errors of about 1e-4.
func TestGPTGradient(t *testing.T) {
	c := tinyGPT
	m := newGPT(t, c, 4, 1, 9)
	perturb(m, 9, 0.15)
	rng := rand.New(rand.NewPCG(3, 3))
	b := randomTokens(rng, c, 3)
	loss := func() float64 {
		st, err := m.ComputeGradients([]Batch{b}, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return st.Loss
	}
	loss()
	grad := slices.Clone(m.Grads())
	p := m.Params()
	const eps = 1e-2
	along := func(idx []int, u []float64) float64 {
		orig := make([]float32, len(idx))
		for k, i := range idx {
			orig[k] = p[i]
		}
		set := func(s float64) {
			for k, i := range idx {
				p[i] = float32(float64(orig[k]) + s*u[k])
			}
			m.SyncReplicas()
		}
		set(eps)
		lp := loss()
		set(-eps)
		lm := loss()
		for k, i := range idx {
			p[i] = orig[k]
		}
		m.SyncReplicas()
		return (lp - lm) / (2 * eps)
	}
	var worst float64 // the largest |fd − an| / |an| seen
	check := func(what string, idx []int, u []float64) {
		var an, norm float64
		for k, i := range idx {
			an += float64(grad[i]) * u[k]
			norm += u[k] * u[k]
		}
		if math.Abs(norm-1) > 1e-9 {
			t.Fatalf("%s: direction of norm %v", what, norm)
		}
		fd := along(idx, u)
		worst = max(worst, math.Abs(fd-an)/math.Abs(an))
		if math.Abs(an) < 1e-2 {
			t.Errorf("%s: derivative %v too small to check", what, an)
		}
		if math.Abs(fd-an) > 5e-4+0.005*math.Abs(an) {
			t.Errorf("%s: analytic derivative %v, finite difference %v", what, an, fd)
		}
	}
	kinds := map[string]bool{}
	for _, bk := range m.Buckets() {
		for _, ti := range bk.Tensors {
			off := bk.Offset + ti.Offset
			idx := make([]int, ti.Len)
			u := make([]float64, ti.Len)
			// Half along the gradient (a strong signal), half random (so a
			// gradient with wrong components cannot pass).
			var gn, rn float64
			r := make([]float64, ti.Len)
			for k := range idx {
				idx[k] = off + k
				r[k] = rng.NormFloat64()
				gn += float64(grad[off+k]) * float64(grad[off+k])
				rn += r[k] * r[k]
			}
			var un float64
			for k := range u {
				u[k] = float64(grad[off+k])/math.Sqrt(gn) + r[k]/math.Sqrt(rn)
				un += u[k] * u[k]
			}
			for k := range u {
				u[k] /= math.Sqrt(un)
			}
			check(ti.Name, idx, u)
			kinds[strings.SplitN(ti.Name, ".", 3)[2]] = true
			if strings.HasSuffix(ti.Name, ".wte") {
				// Single entries: a token of the batch (embedding and head
				// gradient) and one that never occurs (head gradient only).
				occurs := int(b.X[0])
				absent := -1
				for v := 0; v < c.Vocab && absent < 0; v++ {
					if !slices.Contains(b.X, float32(v)) {
						absent = v
					}
				}
				for _, v := range []int{occurs, absent} {
					if v < 0 {
						continue
					}
					best := 0 // the column with the largest gradient
					for j := 0; j < c.DModel; j++ {
						if math.Abs(float64(grad[off+v*c.DModel+j])) > math.Abs(float64(grad[off+v*c.DModel+best])) {
							best = j
						}
					}
					i := off + v*c.DModel + best
					fd := along([]int{i}, []float64{1})
					if math.Abs(fd-float64(grad[i])) > 5e-4+0.05*math.Abs(float64(grad[i])) {
						t.Errorf("wte[%d][%d]: analytic %v, finite difference %v", v, best, grad[i], fd)
					}
				}
			}
		}
	}
	t.Logf("largest relative error of a directional derivative: %.2g", worst)
	if len(kinds) != 16 {
		t.Errorf("checked tensor kinds %v, want all 16", kinds)
	}
}

// TestCausalAttentionGradient checks CausalSelfAttention alone: the
// gradient of L = Σ w·y (w fixed and random) with respect to its input and
// every parameter element, against central differences (float32 forward:
// L's rounding noise is about 1e-5 for these sizes, so with eps = 1e-2 the
// quotient's noise is about 1e-3; the tolerance is 3e-3 + 2 %).
func TestCausalAttentionGradient(t *testing.T) {
	const n, T, D, H = 2, 5, 8, 2
	dev := gpu.NewCPU(0)
	a := NewCausalSelfAttention(D, H, T, 1, 0.3)
	if err := a.Setup(dev, n, []int{T, D}, true); err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	rng := rand.New(rand.NewPCG(4, 4))
	specs := a.Params()
	params := make([][]float32, len(specs))
	var pb, gb []gpu.Buffer
	for i, s := range specs {
		params[i] = make([]float32, numel(s.Shape))
		for j := range params[i] {
			params[i][j] = float32(rng.NormFloat64() * 0.5)
		}
		p, _ := dev.Alloc(len(params[i]))
		g, _ := dev.Alloc(len(params[i]))
		dev.CopyToDevice(p, params[i])
		pb, gb = append(pb, p), append(gb, g)
	}
	a.Bind(pb, gb)
	x := make([]float32, n*T*D)
	w := make([]float32, n*T*D)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
		w[i] = float32(rng.NormFloat64())
	}
	xb, _ := dev.Alloc(len(x))
	wb, _ := dev.Alloc(len(w))
	dev.CopyToDevice(wb, w)
	objective := func() float64 {
		dev.CopyToDevice(xb, x)
		for i := range params {
			dev.CopyToDevice(pb[i], params[i])
		}
		y := a.Forward(Tensor{Buf: xb, Shape: []int{n, T, D}}, true)
		var l float64
		for i, v := range dev.Data(y.Buf) {
			l += float64(v) * float64(w[i])
		}
		return l
	}
	objective()
	dx := slices.Clone(dev.Data(a.Backward(Tensor{Buf: wb, Shape: []int{n, T, D}}).Buf))
	grads := make([][]float32, len(gb))
	for i, g := range gb {
		grads[i] = slices.Clone(dev.Data(g))
	}
	const eps = 1e-2
	fd := func(v *float32) float64 {
		o := *v
		*v = o + eps
		lp := objective()
		*v = o - eps
		lm := objective()
		*v = o
		return (lp - lm) / (2 * eps)
	}
	cmp := func(what string, an float32, num float64) {
		if math.Abs(num-float64(an)) > 3e-3+0.02*math.Abs(num) {
			t.Errorf("%s: analytic %v, finite difference %v", what, an, num)
		}
	}
	for i := range x {
		cmp("dx", dx[i], fd(&x[i]))
	}
	for k := range params {
		for j := range params[k] {
			cmp(specs[k].Name, grads[k][j], fd(&params[k][j]))
		}
	}
	// Causality of the backward pass: with only position 0's outputs in the
	// objective, the input gradient of every later position must be exactly
	// zero (through Q, K and V alike).
	clear(w)
	for s := 0; s < n; s++ {
		for j := 0; j < D; j++ {
			w[s*T*D+j] = 1
		}
	}
	dev.CopyToDevice(wb, w)
	objective()
	dx = dev.Data(a.Backward(Tensor{Buf: wb, Shape: []int{n, T, D}}).Buf)
	for s := 0; s < n; s++ {
		for p := 1; p < T; p++ {
			for j := 0; j < D; j++ {
				if v := dx[(s*T+p)*D+j]; v != 0 {
					t.Fatalf("output 0 has a gradient %v w.r.t. input position %d", v, p)
				}
			}
		}
	}
}

// window makes n training windows of a repeating text at random offsets:
// tokens are bytes, labels the byte that follows each.
func windows(rng *rand.Rand, text string, c GPTConfig, n int) Batch {
	b := Batch{X: make([]float32, 0, n*c.Context), Y: make([]uint8, 0, n*c.Context)}
	for range n {
		o := rng.IntN(len(text))
		for p := 0; p < c.Context; p++ {
			b.X = append(b.X, float32(text[(o+p)%len(text)]))
			b.Y = append(b.Y, text[(o+p+1)%len(text)])
		}
	}
	return b
}

type windowSet struct {
	b Batch
	c GPTConfig
}

func (w windowSet) Len() int       { return len(w.b.Y) / w.c.Context }
func (w windowSet) SampleLen() int { return w.c.Context }
func (w windowSet) Slice(lo, hi int) Batch {
	return Batch{X: w.b.X[lo*w.c.Context : hi*w.c.Context], Y: w.b.Y[lo*w.c.Context : hi*w.c.Context]}
}

// TestGPTLearnsRepeatingText trains a small gpt with adamw on windows of a
// repeating sentence, on two replicas: every next byte is determined by the
// ones before it (given enough context), so the loss must fall from
// ln(128) ≈ 4.85 to far below; 300 steps bring it under 0.1 in practice,
// and the test asks for less than 0.5, with the evaluation accuracy above
// 90 %.
func TestGPTLearnsRepeatingText(t *testing.T) {
	c := GPTConfig{Layers: 2, DModel: 32, Heads: 2, Context: 16, Vocab: 128}
	const text = "the quick brown fox jumps over the lazy dog; "
	m := newGPT(t, c, 8, 2, 11)
	opt, err := NewOptimizer(OptimConfig{Name: "adamw", LR: 3e-3, WeightDecay: 0.01, WarmupSteps: 20}, m)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(6, 6))
	var first, last float64
	const steps = 300
	for step := range steps {
		st, err := m.ComputeGradients([]Batch{windows(rng, text, c, 8), windows(rng, text, c, 8)}, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			first = st.Loss
		}
		last = st.Loss
		m.ApplyGradients(opt, int64(step))
	}
	if math.Abs(first-math.Log(128)) > 0.2 {
		t.Errorf("first loss %v, want about ln 128 = %v", first, math.Log(128))
	}
	ev, err := m.Evaluate(windowSet{windows(rng, text, c, 20), c})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loss %.3f → %.3f; evaluation loss %.3f accuracy %.3f over %d tokens", first, last, ev.Loss, ev.Accuracy(), ev.Samples)
	if last > 0.5 || ev.Loss > 0.5 || ev.Accuracy() < 0.9 {
		t.Errorf("after %d steps: training loss %v, evaluation loss %v accuracy %v", steps, last, ev.Loss, ev.Accuracy())
	}
	if ev.Samples != 20*c.Context {
		t.Errorf("evaluation counted %d labels, want %d", ev.Samples, 20*c.Context)
	}
	if err := m.CheckReplicas(); err != nil {
		t.Error(err)
	}
}

// TestGPTReplicasAndBuckets checks that two replicas given halves of a
// batch produce the gradient of one replica given all of it, and that
// small fusion buckets, handed over in order, give the same bits as one
// large bucket.
func TestGPTReplicasAndBuckets(t *testing.T) {
	c := tinyGPT
	rng := rand.New(rand.NewPCG(8, 8))
	b1, b2 := randomTokens(rng, c, 2), randomTokens(rng, c, 2)
	all := Batch{X: append(slices.Clone(b1.X), b2.X...), Y: append(slices.Clone(b1.Y), b2.Y...)}

	one := newGPT(t, c, 4, 1, 3)
	st1, err := one.ComputeGradients([]Batch{all}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	two := newGPT(t, c, 4, 2, 3)
	st2, err := two.ComputeGradients([]Batch{b1, b2}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st1.Samples != 32 || st2.Samples != 32 || math.Abs(st1.Loss-st2.Loss) > 1e-6 || st1.Correct != st2.Correct {
		t.Errorf("stats: one replica %+v, two %+v", st1, st2)
	}
	for i, g := range one.Grads() {
		if h := two.Grads()[i]; math.Abs(float64(g-h)) > 1e-6+1e-4*math.Abs(float64(g)) {
			t.Fatalf("gradient %d: one replica %v, two %v", i, g, h)
		}
	}

	var small *Model
	small, err = New("gpt", Config{GPT: c, MaxBatch: 4, BucketBytes: 4 * 300}, []gpu.Device{gpu.NewCPU(0)}, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if len(small.Buckets()) < 10 {
		t.Fatalf("%d buckets, want many", len(small.Buckets()))
	}
	next := 0
	if _, err := small.ComputeGradients([]Batch{all}, 0, func(k int) {
		if k != next {
			t.Errorf("bucket %d ready, want %d", k, next)
		}
		next++
	}); err != nil {
		t.Fatal(err)
	}
	if next != len(small.Buckets()) {
		t.Errorf("%d buckets reported, want %d", next, len(small.Buckets()))
	}
	if HashFloats(small.Params()) != HashFloats(one.Params()) {
		t.Error("the parameters depend on the bucket size")
	}
	// Same values, different order: compare tensor by tensor.
	for _, bk := range one.Buckets() {
		for _, ti := range bk.Tensors {
			g := one.Grads()[bk.Offset+ti.Offset:][:ti.Len]
			found := false
			for _, sb := range small.Buckets() {
				for _, si := range sb.Tensors {
					if si.Name == ti.Name {
						found = true
						if !slices.Equal(small.Grads()[sb.Offset+si.Offset:][:si.Len], g) {
							t.Errorf("%s: gradient differs with small buckets", ti.Name)
						}
					}
				}
			}
			if !found {
				t.Errorf("%s missing with small buckets", ti.Name)
			}
		}
	}
}
