package model

import (
	"fmt"
	"math"
	"slices"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// GPTConfig configures the decoder-only transformer "gpt". Zero fields take
// the defaults noted; docs/models.md describes the architecture.
type GPTConfig struct {
	// Layers is the number of transformer blocks (default 4).
	Layers int
	// DModel is the width of the residual stream (default 256); it must be a
	// multiple of Heads.
	DModel int
	// Heads is the number of attention heads (default 4).
	Heads int
	// Context is the number of tokens per sample, each with a next-token
	// label (default 128).
	Context int
	// Vocab is the number of token values (default 256, the most: labels are
	// uint8).
	Vocab int
}

// GPT defaults.
const (
	DefaultGPTLayers  = 4
	DefaultGPTDModel  = 256
	DefaultGPTHeads   = 4
	DefaultGPTContext = 128
	DefaultGPTVocab   = 256
)

// gptInitStd is the standard deviation of the gpt's embeddings and weights
// (GPT-2's 0.02); the projections into the residual stream use
// gptInitStd/√(2·Layers).
const gptInitStd = 0.02

// Resolved returns c with defaults filled in, or an error naming the first
// invalid field.
func (c GPTConfig) Resolved() (GPTConfig, error) {
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{{"Layers", &c.Layers, DefaultGPTLayers}, {"DModel", &c.DModel, DefaultGPTDModel}, {"Heads", &c.Heads, DefaultGPTHeads},
		{"Context", &c.Context, DefaultGPTContext}, {"Vocab", &c.Vocab, DefaultGPTVocab}} {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < 0 {
			return c, fmt.Errorf("model: gpt %s %d must be positive", f.name, *f.v)
		}
	}
	if c.DModel%c.Heads != 0 {
		return c, fmt.Errorf("model: gpt DModel %d is not a multiple of Heads %d", c.DModel, c.Heads)
	}
	if c.Vocab > 256 {
		return c, fmt.Errorf("model: gpt Vocab %d exceeds 256 (labels are uint8)", c.Vocab)
	}
	return c, nil
}

// NumParams returns the parameter count of the gpt c describes (defaults
// filled in): Vocab·D + Context·D + Layers·(12·D² + 13·D) + 2·D.
func (c GPTConfig) NumParams() int {
	c, _ = c.Resolved()
	d := c.DModel
	return c.Vocab*d + c.Context*d + c.Layers*(12*d*d+13*d) + 2*d
}

// gptArch builds the gpt: token and position embedding, the blocks, a final
// LayerNorm and the output head tied to the token embedding.
func gptArch(cfg GPTConfig) (arch, error) {
	c, err := cfg.Resolved()
	if err != nil {
		return arch{}, err
	}
	return arch{input: []int{c.Context}, classes: c.Vocab, positions: c.Context, tokens: c.Vocab, layers: func() []Layer {
		emb := NewTokenEmbedding(c.Vocab, c.Context, c.DModel)
		ls := []Layer{emb}
		for range c.Layers {
			ls = append(ls, NewBlock(c.DModel, c.Heads, c.Context, c.Layers))
		}
		return append(ls, NewLayerNorm(c.DModel), emb.Head())
	}}, nil
}

// TokenEmbedding maps samples of T token IDs (float32 integers in
// [0, Vocab)) to [T, D]: row wte[token] plus row wpe[position]. It must be
// the first layer: token IDs have no gradient.
type TokenEmbedding struct {
	Vocab, T, D int

	dev      gpu.Device
	wte, wpe gpu.Buffer
	dte, dpe gpu.Buffer
	ids      Tensor
	y        *act
	tied     bool
}

// NewTokenEmbedding returns a token and learned position embedding.
func NewTokenEmbedding(vocab, t, d int) *TokenEmbedding {
	return &TokenEmbedding{Vocab: vocab, T: t, D: d}
}

// Describe implements Layer.
func (e *TokenEmbedding) Describe() string {
	return fmt.Sprintf("embedding(v=%d,t=%d,d=%d)", e.Vocab, e.T, e.D)
}

// Params implements Layer: the token table "wte" [Vocab, D] and the
// position table "wpe" [T, D], both InitUniformStd(0.02) and decayed.
func (e *TokenEmbedding) Params() []ParamSpec {
	return []ParamSpec{
		{Name: "wte", Shape: []int{e.Vocab, e.D}, Init: InitUniformStd, Std: gptInitStd, FanIn: e.D, FanOut: e.Vocab, Decay: true},
		{Name: "wpe", Shape: []int{e.T, e.D}, Init: InitUniformStd, Std: gptInitStd, FanIn: e.D, FanOut: e.T, Decay: true},
	}
}

// OutShape implements Layer.
func (e *TokenEmbedding) OutShape(in []int) ([]int, error) {
	if e.Vocab <= 0 || e.T <= 0 || e.D <= 0 {
		return nil, fmt.Errorf("model: %s: sizes must be positive", e.Describe())
	}
	if !slices.Equal(in, []int{e.T}) {
		return nil, fmt.Errorf("model: %s expects samples of [%d] tokens, got %v", e.Describe(), e.T, in)
	}
	return []int{e.T, e.D}, nil
}

// Setup implements Layer.
func (e *TokenEmbedding) Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error {
	if _, err := e.OutShape(in); err != nil {
		return err
	}
	if needDx {
		return fmt.Errorf("model: %s must be the first layer (token IDs have no gradient)", e.Describe())
	}
	e.dev = dev
	var err error
	e.y, err = newAct(dev, maxBatch, []int{e.T, e.D})
	return err
}

// Bind implements Layer.
func (e *TokenEmbedding) Bind(params, grads []gpu.Buffer) {
	e.wte, e.wpe, e.dte, e.dpe = params[0], params[1], grads[0], grads[1]
}

// Forward implements Layer.
func (e *TokenEmbedding) Forward(x Tensor, train bool) Tensor {
	n := x.Batch()
	e.ids = x
	y := e.y.get(n)
	e.dev.Embedding(y.Buf, e.wte, x.Buf, n*e.T, e.Vocab, e.D)
	e.dev.AddBias(y.Buf, n, e.T*e.D, e.wpe)
	return y
}

// Backward implements Layer: the position gradient is the sum over
// samples; the token rows are added to the token-table gradient, which the
// tied head (Head) has written already, or which is zeroed first.
func (e *TokenEmbedding) Backward(dy Tensor) Tensor {
	n := dy.Batch()
	e.dev.SumRows(e.dpe, dy.Buf, n, e.T*e.D)
	if !e.tied {
		e.dev.Fill(e.dte, 0)
	}
	e.dev.EmbeddingBackward(e.dte, e.ids.Buf, dy.Buf, n*e.T, e.Vocab, e.D)
	return Tensor{}
}

// Free implements Layer.
func (e *TokenEmbedding) Free() { e.y.free() }

// Head returns the output layer tied to e: logits = h·wteᵀ. It must come
// after e in the same network, so that its backward pass runs first and
// writes the token-table gradient that e's backward pass adds to.
func (e *TokenEmbedding) Head() *TiedHead {
	e.tied = true
	return &TiedHead{emb: e}
}

// TiedHead is the output projection [T, D] → [T, Vocab] whose weight is the
// token embedding table: it has no parameters of its own, unless it is a
// pipeline stage's copy (copyOf), which holds the table as its parameter
// "wte" and whose gradient is its own part only.
type TiedHead struct {
	emb   *TokenEmbedding
	dev   gpu.Device
	x     Tensor
	y, dx *act
	// own is set for a copy: w and dw are then the head's own table and
	// gradient, not the embedding's.
	own   bool
	w, dw gpu.Buffer
}

// detached returns a head like h that holds its own copy of the token
// table (a pipeline stage without the embedding), and unties the embedding:
// its backward pass then zeroes the table's gradient before adding its rows.
func (h *TiedHead) detached() *TiedHead {
	h.emb.tied = false
	return &TiedHead{emb: h.emb, own: true}
}

// weights returns the table and its gradient.
func (h *TiedHead) weights() (w, dw gpu.Buffer) {
	if h.own {
		return h.w, h.dw
	}
	return h.emb.wte, h.emb.dte
}

// Describe implements Layer.
func (h *TiedHead) Describe() string {
	return fmt.Sprintf("tied_head(d=%d,v=%d)", h.emb.D, h.emb.Vocab)
}

// Params implements Layer: none (the weight is the embedding's wte), or
// for a stage's copy the table "wte", specified as the embedding's.
func (h *TiedHead) Params() []ParamSpec {
	if h.own {
		return h.emb.Params()[:1]
	}
	return nil
}

// OutShape implements Layer.
func (h *TiedHead) OutShape(in []int) ([]int, error) {
	if len(in) == 0 || in[len(in)-1] != h.emb.D {
		return nil, fmt.Errorf("model: %s expects samples ending in %d, got %v", h.Describe(), h.emb.D, in)
	}
	return append(slices.Clone(in[:len(in)-1]), h.emb.Vocab), nil
}

// Setup implements Layer.
func (h *TiedHead) Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error {
	out, err := h.OutShape(in)
	if err != nil {
		return err
	}
	h.dev = dev
	if h.y, err = newAct(dev, maxBatch, out); err != nil {
		return err
	}
	if needDx {
		h.dx, err = newAct(dev, maxBatch, in)
	}
	return err
}

// Bind implements Layer.
func (h *TiedHead) Bind(params, grads []gpu.Buffer) {
	if h.own {
		h.w, h.dw = params[0], grads[0]
	}
}

// Forward implements Layer.
func (h *TiedHead) Forward(x Tensor, train bool) Tensor {
	n := x.Batch()
	rows, d, v := x.Len()/h.emb.D, h.emb.D, h.emb.Vocab
	h.x = x
	y := h.y.get(n)
	w, _ := h.weights()
	h.dev.Gemm(false, true, rows, v, d, 1, x.Buf, d, w, d, 0, y.Buf, v)
	return y
}

// Backward implements Layer: it overwrites the token-table gradient with
// dyᵀ·x (the embedding's backward pass adds its part later).
func (h *TiedHead) Backward(dy Tensor) Tensor {
	n := dy.Batch()
	d, v := h.emb.D, h.emb.Vocab
	rows := dy.Len() / v
	w, dw := h.weights()
	h.dev.Gemm(true, false, v, d, rows, 1, dy.Buf, v, h.x.Buf, d, 0, dw, d)
	if h.dx == nil {
		return Tensor{}
	}
	dx := h.dx.get(n)
	h.dev.Gemm(false, false, rows, d, v, 1, dy.Buf, v, w, d, 0, dx.Buf, d)
	return dx
}

// Free implements Layer.
func (h *TiedHead) Free() { h.y.free(); h.dx.free() }

// Block is a pre-LayerNorm transformer block over samples [T, D]:
// x += Attn(LN1(x)); x += MLP(LN2(x)), with a GELU MLP of width 4·D.
type Block struct {
	D, Heads, T int
	LN1, LN2    *LayerNorm
	Attn        *CausalSelfAttention
	FC1, FC2    *Linear

	gelu Layer
	n    int
}

// NewBlock returns a block of a network of layers blocks (which scales the
// initial weights of the projections into the residual stream).
func NewBlock(d, heads, t, layers int) *Block {
	b := &Block{D: d, Heads: heads, T: t, LN1: NewLayerNorm(d), LN2: NewLayerNorm(d),
		Attn: NewCausalSelfAttention(d, heads, t, layers, gptInitStd),
		FC1:  NewLinear(d, 4*d), FC2: NewLinear(4*d, d), gelu: NewGELU()}
	b.FC1.InitStd = gptInitStd
	b.FC2.InitStd = gptInitStd / math.Sqrt(2*float64(max(layers, 1)))
	return b
}

// Describe implements Layer.
func (b *Block) Describe() string { return fmt.Sprintf("block(d=%d,h=%d,t=%d)", b.D, b.Heads, b.T) }

// sub lists the parameterised sublayers in Params order with their prefixes.
func (b *Block) sub() ([]Layer, []string) {
	return []Layer{b.LN1, b.Attn, b.LN2, b.FC1, b.FC2}, []string{"ln1.", "attn.", "ln2.", "fc1.", "fc2."}
}

// Params implements Layer: ln1, attn (qkv, proj), ln2, fc1, fc2.
func (b *Block) Params() []ParamSpec {
	var ps []ParamSpec
	ls, pre := b.sub()
	for i, l := range ls {
		ps = append(ps, prefixed(pre[i], l.Params())...)
	}
	return ps
}

// OutShape implements Layer.
func (b *Block) OutShape(in []int) ([]int, error) {
	if !slices.Equal(in, []int{b.T, b.D}) {
		return nil, fmt.Errorf("model: %s expects samples [%d, %d], got %v", b.Describe(), b.T, b.D, in)
	}
	return b.Attn.OutShape(in)
}

// Setup implements Layer. The sublayers always compute their input
// gradients: the residual stream needs them.
func (b *Block) Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error {
	if _, err := b.OutShape(in); err != nil {
		return err
	}
	rows := maxBatch * b.T
	for _, s := range []struct {
		l     Layer
		batch int
		in    []int
	}{{b.LN1, maxBatch, in}, {b.Attn, maxBatch, in}, {b.LN2, maxBatch, in},
		{b.FC1, rows, []int{b.D}}, {b.gelu, rows, []int{4 * b.D}}, {b.FC2, rows, []int{4 * b.D}}} {
		if err := s.l.Setup(dev, s.batch, s.in, true); err != nil {
			return fmt.Errorf("model: %s: %w", b.Describe(), err)
		}
	}
	return nil
}

// Bind implements Layer.
func (b *Block) Bind(params, grads []gpu.Buffer) {
	ls, _ := b.sub()
	for _, l := range ls {
		k := len(l.Params())
		l.Bind(params[:k], grads[:k])
		params, grads = params[k:], grads[k:]
	}
}

// Forward implements Layer. The residual sums are written in place over
// the projections' outputs, which their backward passes do not read.
func (b *Block) Forward(x Tensor, train bool) Tensor {
	n := x.Batch()
	b.n = n
	dev := b.Attn.dev
	a := b.Attn.Forward(b.LN1.Forward(x, train), train)
	dev.Add(a.Buf, a.Buf, x.Buf) // x1 = x + attn
	h := b.LN2.Forward(a, train)
	f := b.FC1.Forward(Tensor{Buf: h.Buf, Shape: []int{n * b.T, b.D}}, train)
	o := b.FC2.Forward(b.gelu.Forward(f, train), train)
	dev.Add(o.Buf, o.Buf, a.Buf) // y = x1 + mlp
	return Tensor{Buf: o.Buf, Shape: a.Shape}
}

// Backward implements Layer. The residual gradients are summed in place
// into the LayerNorms' input gradients.
func (b *Block) Backward(dy Tensor) Tensor {
	n, dev := b.n, b.Attn.dev
	g := b.FC2.Backward(Tensor{Buf: dy.Buf, Shape: []int{n * b.T, b.D}})
	g = b.FC1.Backward(b.gelu.Backward(g))
	dx1 := b.LN2.Backward(Tensor{Buf: g.Buf, Shape: dy.Shape})
	dev.Add(dx1.Buf, dx1.Buf, dy.Buf)
	dx := b.LN1.Backward(b.Attn.Backward(dx1))
	dev.Add(dx.Buf, dx.Buf, dx1.Buf)
	return dx
}

// Free implements Layer.
func (b *Block) Free() {
	for _, l := range []Layer{b.LN1, b.Attn, b.LN2, b.FC1, b.gelu, b.FC2} {
		l.Free()
	}
}
