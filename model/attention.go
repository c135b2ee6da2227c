package model

import (
	"fmt"
	"math"
	"slices"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// CausalSelfAttention is multi-head causal self-attention over samples of
// T positions × D features: a fused Q, K, V projection (a Linear D → 3D,
// columns [Q | K | V], head h taking columns h·D/Heads … of each), then per
// sample and head softmax(Q·Kᵀ/√(D/Heads)) with position i attending to
// positions ≤ i only, times V, the heads side by side, and an output
// projection (a Linear D → D).
//
// The per-(sample, head) products are Gemm calls on strided views of the
// projections; the masked softmax runs over all blocks at once
// (gpu.Device.CausalSoftmax).
type CausalSelfAttention struct {
	D, Heads, T int
	// QKV and Proj are the input and output projections (their rows are the
	// batch's positions).
	QKV, Proj *Linear

	dev        gpu.Device
	dh         int
	scale      float32
	q          Tensor // the latest projection, [n·T, 3D]
	n          int    // samples of the latest Forward
	p, dp, o   *act   // probabilities and their gradient [Heads, T, T]; head outputs [T, D]
	dqkv       *act   // [T, 3D]
	vq, vk, vv []gpu.Buffer
	vdq, vdk   []gpu.Buffer
	vdv, vo    []gpu.Buffer
	vp, vdp    []gpu.Buffer
	vdo        []gpu.Buffer
}

// NewCausalSelfAttention returns the attention of a GPT block with layers
// of the network and weights of standard deviation std (the output
// projection's scaled by 1/√(2·layers), as GPT-2 does for the projections
// that feed the residual stream).
func NewCausalSelfAttention(d, heads, t, layers int, std float64) *CausalSelfAttention {
	a := &CausalSelfAttention{D: d, Heads: heads, T: t, QKV: NewLinear(d, 3*d), Proj: NewLinear(d, d)}
	a.QKV.InitStd = std
	a.Proj.InitStd = std / math.Sqrt(2*float64(max(layers, 1)))
	return a
}

// Describe implements Layer.
func (a *CausalSelfAttention) Describe() string {
	return fmt.Sprintf("attention(d=%d,h=%d,t=%d)", a.D, a.Heads, a.T)
}

// Params implements Layer: the QKV weight and bias, then Proj's.
func (a *CausalSelfAttention) Params() []ParamSpec {
	return append(prefixed("qkv.", a.QKV.Params()), prefixed("proj.", a.Proj.Params())...)
}

func prefixed(pre string, ps []ParamSpec) []ParamSpec {
	for i := range ps {
		ps[i].Name = pre + ps[i].Name
	}
	return ps
}

// OutShape implements Layer.
func (a *CausalSelfAttention) OutShape(in []int) ([]int, error) {
	if a.D <= 0 || a.Heads <= 0 || a.T <= 0 || a.D%a.Heads != 0 {
		return nil, fmt.Errorf("model: %s: the width must be a positive multiple of the heads", a.Describe())
	}
	if !slices.Equal(in, []int{a.T, a.D}) {
		return nil, fmt.Errorf("model: %s expects samples [%d, %d], got %v", a.Describe(), a.T, a.D, in)
	}
	return slices.Clone(in), nil
}

// Setup implements Layer.
func (a *CausalSelfAttention) Setup(dev gpu.Device, maxBatch int, in []int, needDx bool) error {
	if _, err := a.OutShape(in); err != nil {
		return err
	}
	a.dev, a.dh = dev, a.D/a.Heads
	a.scale = float32(1 / math.Sqrt(float64(a.dh)))
	rows := maxBatch * a.T
	if err := a.QKV.Setup(dev, rows, []int{a.D}, needDx); err != nil {
		return err
	}
	if err := a.Proj.Setup(dev, rows, []int{a.D}, true); err != nil {
		return err
	}
	var err error
	for _, x := range []struct {
		dst   **act
		shape []int
	}{{&a.p, []int{a.Heads, a.T, a.T}}, {&a.dp, []int{a.Heads, a.T, a.T}}, {&a.o, []int{a.T, a.D}}, {&a.dqkv, []int{a.T, 3 * a.D}}} {
		if *x.dst, err = newAct(dev, maxBatch, x.shape); err != nil {
			return err
		}
	}
	return nil
}

// Bind implements Layer.
func (a *CausalSelfAttention) Bind(params, grads []gpu.Buffer) {
	a.QKV.Bind(params[:2], grads[:2])
	a.Proj.Bind(params[2:4], grads[2:4])
}

// view returns the cached view k of b (off, n), making it on first use. b
// must always be a view from the start of the same allocation, so a view
// made for one batch size stays right for any other.
func (a *CausalSelfAttention) view(cache *[]gpu.Buffer, b gpu.Buffer, k, off, n int) gpu.Buffer {
	c := *cache
	if k >= len(c) {
		c = append(c, make([]gpu.Buffer, k+1-len(c))...)
		*cache = c
	}
	if c[k] == nil {
		c[k] = a.dev.View(b, off, n)
	}
	return c[k]
}

// head returns the views of sample s, head h: a T×dh block of a [T, ld]
// row-major buffer at column col.
func (a *CausalSelfAttention) head(cache *[]gpu.Buffer, b gpu.Buffer, s, h, ld, col int) gpu.Buffer {
	return a.view(cache, b, s*a.Heads+h, s*a.T*ld+col+h*a.dh, (a.T-1)*ld+a.dh)
}

// block returns the T×T block of sample s, head h.
func (a *CausalSelfAttention) block(cache *[]gpu.Buffer, b gpu.Buffer, s, h int) gpu.Buffer {
	k := s*a.Heads + h
	return a.view(cache, b, k, k*a.T*a.T, a.T*a.T)
}

// Forward implements Layer.
func (a *CausalSelfAttention) Forward(x Tensor, train bool) Tensor {
	n, T, D, dh, d := x.Batch(), a.T, a.D, a.dh, a.dev
	a.n = n
	q := a.QKV.Forward(Tensor{Buf: x.Buf, Shape: []int{n * T, D}}, train)
	a.q = q
	p, o := a.p.get(n), a.o.get(n)
	for s := 0; s < n; s++ {
		for h := 0; h < a.Heads; h++ {
			qv, kv := a.head(&a.vq, q.Buf, s, h, 3*D, 0), a.head(&a.vk, q.Buf, s, h, 3*D, D)
			d.Gemm(false, true, T, T, dh, 1, qv, 3*D, kv, 3*D, 0, a.block(&a.vp, p.Buf, s, h), T)
		}
	}
	d.CausalSoftmax(p.Buf, p.Buf, n*a.Heads, T, a.scale)
	for s := 0; s < n; s++ {
		for h := 0; h < a.Heads; h++ {
			vv := a.head(&a.vv, q.Buf, s, h, 3*D, 2*D)
			d.Gemm(false, false, T, dh, T, 1, a.block(&a.vp, p.Buf, s, h), T, vv, 3*D, 0, a.head(&a.vo, o.Buf, s, h, D, 0), D)
		}
	}
	y := a.Proj.Forward(Tensor{Buf: o.Buf, Shape: []int{n * T, D}}, train)
	return Tensor{Buf: y.Buf, Shape: a.sampleShape(n)}
}

func (a *CausalSelfAttention) sampleShape(n int) []int { return []int{n, a.T, a.D} }

// Backward implements Layer.
func (a *CausalSelfAttention) Backward(dy Tensor) Tensor {
	n, T, D, dh, d := a.n, a.T, a.D, a.dh, a.dev
	do := a.Proj.Backward(Tensor{Buf: dy.Buf, Shape: []int{n * T, D}})
	q, p, dp, dq := a.q, a.p.get(n), a.dp.get(n), a.dqkv.get(n)
	for s := 0; s < n; s++ {
		for h := 0; h < a.Heads; h++ {
			dov, vv := a.head(&a.vdo, do.Buf, s, h, D, 0), a.head(&a.vv, q.Buf, s, h, 3*D, 2*D)
			pv := a.block(&a.vp, p.Buf, s, h)
			// dP = dO·Vᵀ, dV = Pᵀ·dO
			d.Gemm(false, true, T, T, dh, 1, dov, D, vv, 3*D, 0, a.block(&a.vdp, dp.Buf, s, h), T)
			d.Gemm(true, false, T, dh, T, 1, pv, T, dov, D, 0, a.head(&a.vdv, dq.Buf, s, h, 3*D, 2*D), 3*D)
		}
	}
	d.CausalSoftmaxBackward(dp.Buf, p.Buf, dp.Buf, n*a.Heads, T, a.scale)
	for s := 0; s < n; s++ {
		for h := 0; h < a.Heads; h++ {
			ds := a.block(&a.vdp, dp.Buf, s, h)
			qv, kv := a.head(&a.vq, q.Buf, s, h, 3*D, 0), a.head(&a.vk, q.Buf, s, h, 3*D, D)
			// dQ = dS·K, dK = dSᵀ·Q (the scale is inside dS)
			d.Gemm(false, false, T, dh, T, 1, ds, T, kv, 3*D, 0, a.head(&a.vdq, dq.Buf, s, h, 3*D, 0), 3*D)
			d.Gemm(true, false, T, dh, T, 1, ds, T, qv, 3*D, 0, a.head(&a.vdk, dq.Buf, s, h, 3*D, D), 3*D)
		}
	}
	dx := a.QKV.Backward(Tensor{Buf: dq.Buf, Shape: []int{n * T, 3 * D}})
	if dx.Buf == nil {
		return Tensor{}
	}
	return Tensor{Buf: dx.Buf, Shape: a.sampleShape(n)}
}

// Free implements Layer.
func (a *CausalSelfAttention) Free() {
	a.QKV.Free()
	a.Proj.Free()
	a.p.free()
	a.dp.free()
	a.o.free()
	a.dqkv.free()
	a.vq, a.vk, a.vv, a.vdq, a.vdk, a.vdv, a.vo, a.vp, a.vdp, a.vdo = nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
}
