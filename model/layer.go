package model

import (
	"fmt"
	"slices"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// Init says how a parameter tensor is initialised.
type Init int

const (
	// InitZero fills with 0 (biases, LayerNorm beta).
	InitZero Init = iota
	// InitOne fills with 1 (LayerNorm gamma).
	InitOne
	// InitHe draws U(−a, a) with a = sqrt(6/fanIn) (Kaiming-uniform, ReLU gain).
	InitHe
	// InitXavier draws U(−a, a) with a = sqrt(6/(fanIn+fanOut)) (Glorot-uniform).
	InitXavier
	// InitUniformStd draws U(−a, a) with a = √3·Std, a distribution of
	// standard deviation Std (the GPT-2 scheme's small weights, drawn
	// uniformly so that every platform computes the same bits).
	InitUniformStd
)

// ParamSpec describes one parameter tensor of a layer.
type ParamSpec struct {
	// Name within the layer: "weight", "bias", "gamma", "beta".
	Name string
	// Shape as the layer uses it (a conv kernel is [out, kh, kw, in]).
	Shape []int
	// Init and the fans it uses.
	Init          Init
	FanIn, FanOut int
	// Std is InitUniformStd's standard deviation.
	Std float64
	// Decay is true where weight decay applies (weights, not biases or norms).
	Decay bool
}

// Matrix returns the shape as a matrix for low-rank codecs: rank ≥ 2 tensors
// are out × rest, vectors stay [n].
func (p ParamSpec) Matrix() []int {
	if len(p.Shape) < 2 {
		return []int{numel(p.Shape)}
	}
	return []int{p.Shape[0], numel(p.Shape[1:])}
}

// Layer is one stage of a feed-forward network, instantiated once per device
// replica. The model calls Setup once, Bind once, then Forward and Backward
// alternately: Backward uses what the latest Forward saved.
//
// Shapes passed to OutShape and Setup are per sample (no batch dimension);
// tensors passed to Forward and Backward carry the batch first.
type Layer interface {
	// Describe returns the layer's type and geometry, e.g. "linear(784,1024)".
	Describe() string
	// Params lists the layer's parameter tensors in the order Bind expects.
	Params() []ParamSpec
	// OutShape returns the output sample shape for an input sample shape.
	OutShape(in []int) ([]int, error)
	// Setup allocates buffers on dev for batches of up to maxBatch samples of
	// shape in. needDx is false for the first layer, whose input gradient
	// nobody needs.
	Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error
	// Bind hands the layer its parameter and gradient buffers, one per ParamSpec.
	Bind(params, grads []gpu.Buffer)
	// Forward computes the output for x; train selects training behaviour
	// (dropout). The output stays valid until the next Forward.
	Forward(x Tensor, train bool) Tensor
	// Backward overwrites the parameter gradients from dy and returns the
	// input gradient (a zero Tensor when Setup's needDx was false).
	Backward(dy Tensor) Tensor
	// Free releases the layer's buffers.
	Free()
}

// seeder is implemented by layers that draw random numbers in training.
type seeder interface {
	SetSeed(seed uint64)
}

func checkFlat(in []int, want int, what string) error {
	if numel(in) != want {
		return fmt.Errorf("model: %s expects %d features per sample, got shape %v", what, want, in)
	}
	return nil
}

// Linear is a fully connected layer y = x·Wᵀ + b with W of shape [Out, In].
// Its input may have any sample shape with In elements.
type Linear struct {
	In, Out int
	// Xavier selects Glorot instead of He initialisation (for output layers).
	Xavier bool
	// InitStd, when positive, overrides both: the weight is InitUniformStd
	// with this standard deviation (transformer layers).
	InitStd float64

	dev    gpu.Device
	w, b   gpu.Buffer
	dw, db gpu.Buffer
	x      Tensor
	y, dx  *act
	needDx bool
	inSh   []int
}

// NewLinear returns a Linear layer.
func NewLinear(in, out int) *Linear { return &Linear{In: in, Out: out} }

// Describe implements Layer.
func (l *Linear) Describe() string { return fmt.Sprintf("linear(%d,%d)", l.In, l.Out) }

// Params implements Layer.
func (l *Linear) Params() []ParamSpec {
	init := InitHe
	if l.Xavier {
		init = InitXavier
	}
	if l.InitStd > 0 {
		init = InitUniformStd
	}
	return []ParamSpec{
		{Name: "weight", Shape: []int{l.Out, l.In}, Init: init, FanIn: l.In, FanOut: l.Out, Std: l.InitStd, Decay: true},
		{Name: "bias", Shape: []int{l.Out}, Init: InitZero},
	}
}

// OutShape implements Layer.
func (l *Linear) OutShape(in []int) ([]int, error) {
	if err := checkFlat(in, l.In, l.Describe()); err != nil {
		return nil, err
	}
	return []int{l.Out}, nil
}

// Setup implements Layer.
func (l *Linear) Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error {
	if _, err := l.OutShape(in); err != nil {
		return err
	}
	l.dev, l.needDx, l.inSh = dev, needDx, slices.Clone(in)
	var err error
	if l.y, err = newAct(dev, maxBatch, []int{l.Out}); err != nil {
		return err
	}
	if needDx {
		if l.dx, err = newAct(dev, maxBatch, in); err != nil {
			return err
		}
	}
	return nil
}

// Bind implements Layer.
func (l *Linear) Bind(params, grads []gpu.Buffer) {
	l.w, l.b, l.dw, l.db = params[0], params[1], grads[0], grads[1]
}

// Forward implements Layer.
func (l *Linear) Forward(x Tensor, train bool) Tensor {
	n := x.Batch()
	l.x = x
	y := l.y.get(n)
	l.dev.Gemm(false, true, n, l.Out, l.In, 1, x.Buf, l.In, l.w, l.In, 0, y.Buf, l.Out)
	l.dev.AddBias(y.Buf, n, l.Out, l.b)
	return y
}

// Backward implements Layer.
func (l *Linear) Backward(dy Tensor) Tensor {
	n := dy.Batch()
	l.dev.Gemm(true, false, l.Out, l.In, n, 1, dy.Buf, l.Out, l.x.Buf, l.In, 0, l.dw, l.In)
	l.dev.SumRows(l.db, dy.Buf, n, l.Out)
	if !l.needDx {
		return Tensor{}
	}
	dx := l.dx.get(n)
	l.dev.Gemm(false, false, n, l.In, l.Out, 1, dy.Buf, l.Out, l.w, l.In, 0, dx.Buf, l.In)
	return dx
}

// Free implements Layer.
func (l *Linear) Free() { l.y.free(); l.dx.free() }

// activation is the shared body of ReLU and GELU.
type activation struct {
	name  string
	fwd   func(d gpu.Device, y, x gpu.Buffer)
	bwd   func(d gpu.Device, dx, x, dy gpu.Buffer)
	dev   gpu.Device
	x     Tensor
	y, dx *act
}

// NewReLU returns an element-wise max(x, 0) layer.
func NewReLU() Layer {
	return &activation{name: "relu",
		fwd: func(d gpu.Device, y, x gpu.Buffer) { d.ReLU(y, x) },
		bwd: func(d gpu.Device, dx, x, dy gpu.Buffer) { d.ReLUBackward(dx, x, dy) }}
}

// NewGELU returns an element-wise x·Φ(x) layer.
func NewGELU() Layer {
	return &activation{name: "gelu",
		fwd: func(d gpu.Device, y, x gpu.Buffer) { d.GELU(y, x) },
		bwd: func(d gpu.Device, dx, x, dy gpu.Buffer) { d.GELUBackward(dx, x, dy) }}
}

func (a *activation) Describe() string                 { return a.name }
func (a *activation) Params() []ParamSpec              { return nil }
func (a *activation) OutShape(in []int) ([]int, error) { return slices.Clone(in), nil }
func (a *activation) Bind(_, _ []gpu.Buffer)           {}
func (a *activation) Free()                            { a.y.free(); a.dx.free() }

func (a *activation) Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error {
	a.dev = dev
	var err error
	if a.y, err = newAct(dev, maxBatch, in); err != nil {
		return err
	}
	if needDx {
		a.dx, err = newAct(dev, maxBatch, in)
	}
	return err
}

func (a *activation) Forward(x Tensor, train bool) Tensor {
	a.x = x
	y := a.y.get(x.Batch())
	a.fwd(a.dev, y.Buf, x.Buf)
	return y
}

func (a *activation) Backward(dy Tensor) Tensor {
	if a.dx == nil {
		return Tensor{}
	}
	dx := a.dx.get(dy.Batch())
	a.bwd(a.dev, dx.Buf, a.x.Buf, dy.Buf)
	return dx
}

// Conv2d is a 2-D convolution over NHWC samples [H, W, InC] with a kernel of
// shape [OutC, K, K, InC] (stored as OutC × K·K·InC), stride 1 or more and zero
// padding. It runs as im2col followed by one GEMM for the whole batch.
type Conv2d struct {
	InC, OutC, K, Stride, Pad int

	dev    gpu.Device
	w, b   gpu.Buffer
	dw, db gpu.Buffer
	geom   gpu.ConvShape // for the batch of the latest Forward
	col    *act          // im2col of the input, reused for its gradient
	y, dx  *act
	needDx bool
}

// NewConv2d returns a square-kernel convolution.
func NewConv2d(inC, outC, k, stride, pad int) *Conv2d {
	return &Conv2d{InC: inC, OutC: outC, K: k, Stride: stride, Pad: pad}
}

// Describe implements Layer.
func (c *Conv2d) Describe() string {
	return fmt.Sprintf("conv2d(%d,%d,k=%d,s=%d,p=%d)", c.InC, c.OutC, c.K, c.Stride, c.Pad)
}

// Params implements Layer.
func (c *Conv2d) Params() []ParamSpec {
	fanIn := c.InC * c.K * c.K
	return []ParamSpec{
		{Name: "weight", Shape: []int{c.OutC, c.K, c.K, c.InC}, Init: InitHe, FanIn: fanIn, FanOut: c.OutC * c.K * c.K, Decay: true},
		{Name: "bias", Shape: []int{c.OutC}, Init: InitZero},
	}
}

func (c *Conv2d) shape(n int, in []int) (gpu.ConvShape, error) {
	if len(in) != 3 || in[2] != c.InC {
		return gpu.ConvShape{}, fmt.Errorf("model: %s expects samples [H, W, %d], got %v", c.Describe(), c.InC, in)
	}
	return gpu.NewConvShape(n, in[0], in[1], in[2], c.K, c.K, c.Stride, c.Pad)
}

// OutShape implements Layer.
func (c *Conv2d) OutShape(in []int) ([]int, error) {
	s, err := c.shape(1, in)
	if err != nil {
		return nil, err
	}
	return []int{s.OutH, s.OutW, c.OutC}, nil
}

// Setup implements Layer.
func (c *Conv2d) Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error {
	s, err := c.shape(maxBatch, in)
	if err != nil {
		return err
	}
	c.dev, c.geom, c.needDx = dev, s, needDx
	if c.col, err = newAct(dev, maxBatch, []int{s.OutH * s.OutW, s.ColCols()}); err != nil {
		return err
	}
	if c.y, err = newAct(dev, maxBatch, []int{s.OutH, s.OutW, c.OutC}); err != nil {
		return err
	}
	if needDx {
		c.dx, err = newAct(dev, maxBatch, in)
	}
	return err
}

// Bind implements Layer.
func (c *Conv2d) Bind(params, grads []gpu.Buffer) {
	c.w, c.b, c.dw, c.db = params[0], params[1], grads[0], grads[1]
}

// Forward implements Layer.
func (c *Conv2d) Forward(x Tensor, train bool) Tensor {
	n := x.Batch()
	c.geom.N = n
	s := c.geom
	col := c.col.get(n)
	c.dev.Im2Col(col.Buf, x.Buf, s)
	y := c.y.get(n)
	rows, K := s.ColRows(), s.ColCols()
	c.dev.Gemm(false, true, rows, c.OutC, K, 1, col.Buf, K, c.w, K, 0, y.Buf, c.OutC)
	c.dev.AddBias(y.Buf, rows, c.OutC, c.b)
	return y
}

// Backward implements Layer.
func (c *Conv2d) Backward(dy Tensor) Tensor {
	s := c.geom
	rows, K := s.ColRows(), s.ColCols()
	col := c.col.get(s.N)
	c.dev.Gemm(true, false, c.OutC, K, rows, 1, dy.Buf, c.OutC, col.Buf, K, 0, c.dw, K)
	c.dev.SumRows(c.db, dy.Buf, rows, c.OutC)
	if !c.needDx {
		return Tensor{}
	}
	// The im2col matrix is no longer needed: reuse it for its gradient.
	c.dev.Gemm(false, false, rows, K, c.OutC, 1, dy.Buf, c.OutC, c.w, K, 0, col.Buf, K)
	dx := c.dx.get(s.N)
	c.dev.Col2Im(dx.Buf, col.Buf, s)
	return dx
}

// Free implements Layer.
func (c *Conv2d) Free() { c.col.free(); c.y.free(); c.dx.free() }

// MaxPool2d takes the maximum over K×K windows moved by Stride of NHWC samples.
type MaxPool2d struct {
	K, Stride int

	dev       gpu.Device
	geom      gpu.PoolShape
	y, am, dx *act
}

// NewMaxPool2d returns a max-pooling layer.
func NewMaxPool2d(k, stride int) *MaxPool2d { return &MaxPool2d{K: k, Stride: stride} }

// Describe implements Layer.
func (p *MaxPool2d) Describe() string { return fmt.Sprintf("maxpool(%d,s=%d)", p.K, p.Stride) }

// Params implements Layer.
func (p *MaxPool2d) Params() []ParamSpec { return nil }

func (p *MaxPool2d) shape(n int, in []int) (gpu.PoolShape, error) {
	if len(in) != 3 {
		return gpu.PoolShape{}, fmt.Errorf("model: %s expects samples [H, W, C], got %v", p.Describe(), in)
	}
	return gpu.NewPoolShape(n, in[0], in[1], in[2], p.K, p.Stride)
}

// OutShape implements Layer.
func (p *MaxPool2d) OutShape(in []int) ([]int, error) {
	s, err := p.shape(1, in)
	if err != nil {
		return nil, err
	}
	return []int{s.OutH, s.OutW, s.C}, nil
}

// Setup implements Layer.
func (p *MaxPool2d) Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error {
	s, err := p.shape(maxBatch, in)
	if err != nil {
		return err
	}
	p.dev, p.geom = dev, s
	out := []int{s.OutH, s.OutW, s.C}
	if p.y, err = newAct(dev, maxBatch, out); err != nil {
		return err
	}
	if p.am, err = newAct(dev, maxBatch, out); err != nil {
		return err
	}
	if needDx {
		p.dx, err = newAct(dev, maxBatch, in)
	}
	return err
}

// Bind implements Layer.
func (p *MaxPool2d) Bind(_, _ []gpu.Buffer) {}

// Forward implements Layer.
func (p *MaxPool2d) Forward(x Tensor, train bool) Tensor {
	n := x.Batch()
	p.geom.N = n
	y := p.y.get(n)
	p.dev.MaxPool(y.Buf, p.am.get(n).Buf, x.Buf, p.geom)
	return y
}

// Backward implements Layer.
func (p *MaxPool2d) Backward(dy Tensor) Tensor {
	if p.dx == nil {
		return Tensor{}
	}
	n := p.geom.N
	dx := p.dx.get(n)
	p.dev.MaxPoolBackward(dx.Buf, dy.Buf, p.am.get(n).Buf, p.geom)
	return dx
}

// Free implements Layer.
func (p *MaxPool2d) Free() { p.y.free(); p.am.free(); p.dx.free() }

// Flatten reshapes samples to vectors; NHWC order is kept, so it moves no data.
type Flatten struct {
	out, in  []int
	fwd, bwd []int // cached batch shapes, so steady-state steps allocate nothing
}

// NewFlatten returns a Flatten layer.
func NewFlatten() *Flatten { return &Flatten{} }

// Describe implements Layer.
func (f *Flatten) Describe() string { return "flatten" }

// Params implements Layer.
func (f *Flatten) Params() []ParamSpec { return nil }

// OutShape implements Layer.
func (f *Flatten) OutShape(in []int) ([]int, error) { return []int{numel(in)}, nil }

// Setup implements Layer.
func (f *Flatten) Setup(_ gpu.Device, _ int, in []int, _ bool) error {
	f.in, f.out = slices.Clone(in), []int{numel(in)}
	return nil
}

// Bind implements Layer.
func (f *Flatten) Bind(_, _ []gpu.Buffer) {}

// reshape returns t with sample shape sample, reusing *cache when it fits.
func reshape(t Tensor, sample []int, cache *[]int) Tensor {
	c := *cache
	if len(c) == 0 || c[0] != t.Batch() {
		c = append([]int{t.Batch()}, sample...)
		*cache = c
	}
	return Tensor{Buf: t.Buf, Shape: c}
}

// Forward implements Layer.
func (f *Flatten) Forward(x Tensor, train bool) Tensor { return reshape(x, f.out, &f.fwd) }

// Backward implements Layer.
func (f *Flatten) Backward(dy Tensor) Tensor { return reshape(dy, f.in, &f.bwd) }

// Free implements Layer.
func (f *Flatten) Free() {}

// Dropout zeroes each element with probability P in training and scales the
// rest by 1/(1−P); it is the identity in evaluation. Its mask comes from the
// seed the model sets before each training forward pass.
type Dropout struct {
	P float32

	dev        gpu.Device
	seed       uint64
	mask, y, d *act
	train      bool
}

// NewDropout returns a Dropout layer.
func NewDropout(p float32) *Dropout { return &Dropout{P: p} }

// Describe implements Layer.
func (d *Dropout) Describe() string { return fmt.Sprintf("dropout(%g)", d.P) }

// Params implements Layer.
func (d *Dropout) Params() []ParamSpec { return nil }

// OutShape implements Layer.
func (d *Dropout) OutShape(in []int) ([]int, error) {
	if !(d.P >= 0 && d.P < 1) {
		return nil, fmt.Errorf("model: dropout probability %v not in [0, 1)", d.P)
	}
	return slices.Clone(in), nil
}

// SetSeed sets the seed of the next training forward pass's mask.
func (d *Dropout) SetSeed(seed uint64) { d.seed = seed }

// Setup implements Layer.
func (d *Dropout) Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error {
	if _, err := d.OutShape(in); err != nil {
		return err
	}
	d.dev = dev
	var err error
	if d.mask, err = newAct(dev, maxBatch, in); err != nil {
		return err
	}
	if d.y, err = newAct(dev, maxBatch, in); err != nil {
		return err
	}
	if needDx {
		d.d, err = newAct(dev, maxBatch, in)
	}
	return err
}

// Bind implements Layer.
func (d *Dropout) Bind(_, _ []gpu.Buffer) {}

// Forward implements Layer.
func (d *Dropout) Forward(x Tensor, train bool) Tensor {
	d.train = train
	if !train || d.P == 0 {
		return x
	}
	n := x.Batch()
	m := d.mask.get(n)
	d.dev.DropoutMask(m.Buf, d.P, d.seed)
	y := d.y.get(n)
	d.dev.Mul(y.Buf, x.Buf, m.Buf)
	return y
}

// Backward implements Layer.
func (d *Dropout) Backward(dy Tensor) Tensor {
	if d.d == nil {
		return Tensor{}
	}
	if !d.train || d.P == 0 {
		return dy
	}
	n := dy.Batch()
	dx := d.d.get(n)
	d.dev.Mul(dx.Buf, dy.Buf, d.mask.get(n).Buf)
	return dx
}

// Free implements Layer.
func (d *Dropout) Free() { d.mask.free(); d.y.free(); d.d.free() }

// LayerNorm normalises the last dimension (of size Dim) of every sample and
// applies a learned scale (gamma) and shift (beta).
type LayerNorm struct {
	Dim int
	Eps float32

	dev        gpu.Device
	g, b       gpu.Buffer
	dg, db     gpu.Buffer
	x          Tensor
	rowsPer    int
	y, dx      *act
	mean, rstd *act
}

// NewLayerNorm returns a LayerNorm over a last dimension of dim with eps 1e-5.
func NewLayerNorm(dim int) *LayerNorm { return &LayerNorm{Dim: dim, Eps: 1e-5} }

// Describe implements Layer.
func (l *LayerNorm) Describe() string { return fmt.Sprintf("layernorm(%d,eps=%g)", l.Dim, l.Eps) }

// Params implements Layer.
func (l *LayerNorm) Params() []ParamSpec {
	return []ParamSpec{
		{Name: "gamma", Shape: []int{l.Dim}, Init: InitOne},
		{Name: "beta", Shape: []int{l.Dim}, Init: InitZero},
	}
}

// OutShape implements Layer.
func (l *LayerNorm) OutShape(in []int) ([]int, error) {
	if len(in) == 0 || in[len(in)-1] != l.Dim {
		return nil, fmt.Errorf("model: %s expects samples ending in %d, got %v", l.Describe(), l.Dim, in)
	}
	return slices.Clone(in), nil
}

// Setup implements Layer.
func (l *LayerNorm) Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error {
	if _, err := l.OutShape(in); err != nil {
		return err
	}
	l.dev, l.rowsPer = dev, numel(in)/l.Dim
	var err error
	if l.y, err = newAct(dev, maxBatch, in); err != nil {
		return err
	}
	if l.mean, err = newAct(dev, maxBatch, []int{l.rowsPer}); err != nil {
		return err
	}
	if l.rstd, err = newAct(dev, maxBatch, []int{l.rowsPer}); err != nil {
		return err
	}
	if needDx {
		l.dx, err = newAct(dev, maxBatch, in)
	}
	return err
}

// Bind implements Layer.
func (l *LayerNorm) Bind(params, grads []gpu.Buffer) {
	l.g, l.b, l.dg, l.db = params[0], params[1], grads[0], grads[1]
}

// Forward implements Layer.
func (l *LayerNorm) Forward(x Tensor, train bool) Tensor {
	n := x.Batch()
	l.x = x
	y := l.y.get(n)
	l.dev.LayerNorm(y.Buf, l.mean.get(n).Buf, l.rstd.get(n).Buf, x.Buf, l.g, l.b, n*l.rowsPer, l.Dim, l.Eps)
	return y
}

// Backward implements Layer.
func (l *LayerNorm) Backward(dy Tensor) Tensor {
	n := dy.Batch()
	dx := Tensor{}
	var dxb gpu.Buffer
	if l.dx != nil {
		dx = l.dx.get(n)
		dxb = dx.Buf
	} else {
		// dgamma and dbeta still need a dx target; the output buffer is free now.
		dxb = l.y.get(n).Buf
	}
	l.dev.LayerNormBackward(dxb, l.dg, l.db, dy.Buf, l.x.Buf, l.mean.get(n).Buf, l.rstd.get(n).Buf, l.g, n*l.rowsPer, l.Dim)
	return dx
}

// Free implements Layer.
func (l *LayerNorm) Free() { l.y.free(); l.dx.free(); l.mean.free(); l.rstd.free() }
