package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// gradCase is one layer configuration for the finite-difference check.
type gradCase struct {
	name  string
	layer func() Layer
	in    []int // per-sample input shape
	batch int
	// input generates the input; nil draws U(-1, 1).
	input func(r *rand.Rand, n int) []float32
	eps   float64
}

// awayFromZero draws values with |x| in [0.1, 1] so ReLU has no kink nearby.
func awayFromZero(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		v := 0.1 + 0.9*r.Float32()
		if r.IntN(2) == 0 {
			v = -v
		}
		x[i] = v
	}
	return x
}

// spaced draws a permutation of well-separated values, so a small
// perturbation never changes which element of a pooling window is largest.
func spaced(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i, p := range r.Perm(n) {
		x[i] = float32(p)*0.05 - float32(n)*0.025
	}
	return x
}

func gradCases() []gradCase {
	return []gradCase{
		{name: "Linear", layer: func() Layer { return NewLinear(7, 5) }, in: []int{7}, batch: 4, eps: 1e-2},
		{name: "LinearFromImage", layer: func() Layer { return NewLinear(12, 3) }, in: []int{2, 2, 3}, batch: 2, eps: 1e-2},
		{name: "ReLU", layer: func() Layer { return NewReLU() }, in: []int{9}, batch: 3, input: awayFromZero, eps: 1e-2},
		{name: "GELU", layer: func() Layer { return NewGELU() }, in: []int{9}, batch: 3, eps: 1e-2},
		{name: "Conv2d", layer: func() Layer { return NewConv2d(3, 4, 3, 1, 1) }, in: []int{5, 5, 3}, batch: 2, eps: 1e-2},
		{name: "Conv2dStride2", layer: func() Layer { return NewConv2d(2, 3, 3, 2, 0) }, in: []int{7, 6, 2}, batch: 2, eps: 1e-2},
		{name: "MaxPool2d", layer: func() Layer { return NewMaxPool2d(2, 2) }, in: []int{4, 6, 3}, batch: 2, input: spaced, eps: 1e-2},
		{name: "MaxPool2dOverlap", layer: func() Layer { return NewMaxPool2d(3, 2) }, in: []int{5, 5, 2}, batch: 2, input: spaced, eps: 1e-2},
		{name: "Flatten", layer: func() Layer { return NewFlatten() }, in: []int{2, 3, 2}, batch: 2, eps: 1e-2},
		{name: "Dropout", layer: func() Layer { d := NewDropout(0.3); d.SetSeed(77); return d }, in: []int{20}, batch: 3, eps: 1e-2},
		{name: "LayerNorm", layer: func() Layer { return NewLayerNorm(8) }, in: []int{8}, batch: 3, eps: 5e-3},
		{name: "LayerNormImage", layer: func() Layer { return NewLayerNorm(4) }, in: []int{3, 4}, batch: 2, eps: 5e-3},
	}
}

// layerHarness runs a single layer on the CPU device with host-side
// parameters, so the test can perturb anything.
type layerHarness struct {
	dev    *gpu.CPU
	l      Layer
	in     []int
	n      int
	params [][]float32
	pbuf   []gpu.Buffer
	gbuf   []gpu.Buffer
	x      gpu.Buffer
	xs     []float32
	r      []float32 // projection: loss = Σ y·r
}

func newHarness(t *testing.T, tc gradCase, rng *rand.Rand) *layerHarness {
	t.Helper()
	h := &layerHarness{dev: gpu.NewCPU(0), l: tc.layer(), in: tc.in, n: tc.batch}
	out, err := h.l.OutShape(tc.in)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.l.Setup(h.dev, tc.batch, tc.in, true); err != nil {
		t.Fatal(err)
	}
	for _, p := range h.l.Params() {
		v := make([]float32, numel(p.Shape))
		for i := range v {
			v[i] = rng.Float32()*2 - 1
			if p.Init == InitOne {
				v[i] += 1.5
			}
		}
		pb, _ := h.dev.Alloc(len(v))
		gb, _ := h.dev.Alloc(len(v))
		h.params = append(h.params, v)
		h.pbuf = append(h.pbuf, pb)
		h.gbuf = append(h.gbuf, gb)
	}
	h.l.Bind(h.pbuf, h.gbuf)
	if tc.input != nil {
		h.xs = tc.input(rng, tc.batch*numel(tc.in))
	} else {
		h.xs = make([]float32, tc.batch*numel(tc.in))
		for i := range h.xs {
			h.xs[i] = rng.Float32()*2 - 1
		}
	}
	h.x, _ = h.dev.Alloc(len(h.xs))
	h.r = make([]float32, tc.batch*numel(out))
	for i := range h.r {
		h.r[i] = rng.Float32()*2 - 1
	}
	return h
}

// loss uploads inputs and parameters, runs Forward and returns Σ y·r.
func (h *layerHarness) loss() (float64, Tensor) {
	h.dev.CopyToDevice(h.x, h.xs)
	for i, p := range h.params {
		h.dev.CopyToDevice(h.pbuf[i], p)
	}
	y := h.l.Forward(Tensor{Buf: h.x, Shape: append([]int{h.n}, h.in...)}, true)
	ys := h.dev.Data(y.Buf)
	var s float64
	for i, v := range ys[:len(h.r)] {
		s += float64(v) * float64(h.r[i])
	}
	return s, y
}

func TestLayerGradients(t *testing.T) {
	for ci, tc := range gradCases() {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 5))
			h := newHarness(t, tc, rng)
			defer h.l.Free()
			_, y := h.loss()
			dyb, _ := h.dev.Alloc(len(h.r))
			h.dev.CopyToDevice(dyb, h.r)
			dx := h.l.Backward(Tensor{Buf: dyb, Shape: y.Shape})
			if dx.Buf == nil {
				t.Fatal("Backward returned no input gradient")
			}
			analytic := map[string][]float32{"x": append([]float32(nil), h.dev.Data(dx.Buf)[:len(h.xs)]...)}
			for i, p := range h.l.Params() {
				analytic[p.Name] = append([]float32(nil), h.dev.Data(h.gbuf[i])...)
			}
			check := func(name string, v []float32, g []float32) {
				// Check up to 40 coordinates, chosen by the seeded generator.
				idx := rng.Perm(len(v))
				if len(idx) > 40 {
					idx = idx[:40]
				}
				for _, i := range idx {
					old := v[i]
					v[i] = old + float32(tc.eps)
					lp, _ := h.loss()
					v[i] = old - float32(tc.eps)
					lm, _ := h.loss()
					v[i] = old
					num := (lp - lm) / (2 * tc.eps)
					if math.Abs(num-float64(g[i])) > 2e-3+2e-2*math.Abs(num) {
						t.Errorf("d%s[%d]: analytic %v, numeric %v", name, i, g[i], num)
					}
				}
			}
			check("x", h.xs, analytic["x"])
			for i, p := range h.l.Params() {
				check(p.Name, h.params[i], analytic[p.Name])
			}
		})
	}
}

// TestSoftmaxCrossEntropyGradient checks the loss layer: mean cross-entropy
// against its finite differences.
func TestSoftmaxCrossEntropyGradient(t *testing.T) {
	d := gpu.NewCPU(0)
	rng := rand.New(rand.NewPCG(3, 3))
	rows, cols := 5, 10
	z := make([]float32, rows*cols)
	for i := range z {
		z[i] = rng.Float32()*4 - 2
	}
	labels := make([]float32, rows)
	for i := range labels {
		labels[i] = float32(rng.IntN(cols))
	}
	zb, _ := d.Alloc(len(z))
	lb, _ := d.Alloc(rows)
	pb, _ := d.Alloc(len(z))
	lossb, _ := d.Alloc(rows)
	gb, _ := d.Alloc(len(z))
	d.CopyToDevice(lb, labels)
	loss := func() float64 {
		d.CopyToDevice(zb, z)
		d.SoftmaxCrossEntropy(pb, lossb, zb, lb, rows, cols)
		var s float64
		for _, v := range d.Data(lossb) {
			s += float64(v)
		}
		return s / float64(rows)
	}
	loss()
	d.SoftmaxCrossEntropyBackward(gb, pb, lb, rows, cols, 1/float32(rows))
	g := append([]float32(nil), d.Data(gb)...)
	const eps = 1e-2
	for i := range z {
		old := z[i]
		z[i] = old + eps
		lp := loss()
		z[i] = old - eps
		lm := loss()
		z[i] = old
		num := (lp - lm) / (2 * eps)
		if math.Abs(num-float64(g[i])) > 1e-3+1e-2*math.Abs(num) {
			t.Errorf("dlogits[%d]: analytic %v, numeric %v", i, g[i], num)
		}
	}
}

// TestModelGradients checks whole models end to end (buckets, views, layer
// wiring) against finite differences of the mean loss.
func TestModelGradients(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		n    int
	}{
		{"mlp", Config{Hidden: []int{16, 12}, BucketBytes: 256, MaxBatch: 4}, 3},
		{"cnn", Config{BucketBytes: 64 << 10, MaxBatch: 2}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.name, tc.cfg, []gpu.Device{gpu.NewCPU(0)}, 9)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			rng := rand.New(rand.NewPCG(11, 0))
			b := randomBatch(rng, tc.n)
			if _, err := m.ComputeGradients([]Batch{b}, 0, nil); err != nil {
				t.Fatal(err)
			}
			g := append([]float32(nil), m.Grads()...)
			r := m.replicas[0]
			// A coordinate passes when the central difference at one of two
			// step sizes agrees: a ReLU or max-pool kink within reach of one
			// step is rarely within reach of both. float32 rounding of the
			// loss (~1e-7) stays well below the tolerance.
			numeric := func(i int, eps float32) float64 {
				old := m.params[i]
				m.params[i] = old + eps
				m.SyncReplicas()
				lp := r.forward(m, b, false, 0).Loss
				m.params[i] = old - eps
				m.SyncReplicas()
				lm := r.forward(m, b, false, 0).Loss
				m.params[i] = old
				return (lp - lm) / float64(2*eps)
			}
			for _, bk := range m.Buckets() {
				for _, ti := range bk.Tensors {
					for k := 0; k < 4; k++ {
						i := bk.Offset + ti.Offset + rng.IntN(ti.Len)
						ok := false
						var nums []float64
						for _, eps := range []float32{1e-3, 3e-4} {
							num := numeric(i, eps)
							nums = append(nums, num)
							if math.Abs(num-float64(g[i])) <= 3e-3+3e-2*math.Abs(num) {
								ok = true
								break
							}
						}
						if !ok {
							t.Errorf("%s element %d: analytic %v, numeric %v", ti.Name, i-bk.Offset-ti.Offset, g[i], nums)
						}
					}
				}
			}
			m.SyncReplicas()
		})
	}
}

func randomBatch(rng *rand.Rand, n int) Batch {
	b := Batch{X: make([]float32, n*784), Y: make([]uint8, n)}
	for i := range b.X {
		b.X[i] = rng.Float32()*2 - 1
	}
	for i := range b.Y {
		b.Y[i] = uint8(rng.IntN(10))
	}
	return b
}

func ExampleNew() {
	m, err := New("mlp", Config{Hidden: []int{32}}, []gpu.Device{gpu.NewCPU(0)}, 1)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	for _, b := range m.Buckets() {
		fmt.Println(b.Index, b.Shapes())
	}
	_, err = New("resnet", Config{}, []gpu.Device{gpu.NewCPU(0)}, 1)
	fmt.Println(err)
	// Output:
	// 0 [[10 32] [10] [32 784] [32]]
	// model: unknown model "resnet" (valid: cnn, gpt, mlp)
}
