package model

import (
	"fmt"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// Tensor is a row-major array on a Device: a buffer and its shape. The first
// dimension of an activation is the batch.
type Tensor struct {
	Buf   gpu.Buffer
	Shape []int
}

// Len returns the number of elements the shape covers.
func (t Tensor) Len() int { return numel(t.Shape) }

// Batch returns the first dimension.
func (t Tensor) Batch() int { return t.Shape[0] }

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// act is an activation buffer allocated for a maximum batch, handing out a
// cached view for the batch actually used so steady-state steps allocate nothing.
type act struct {
	dev   gpu.Device
	base  gpu.Buffer
	per   int // elements per sample
	n     int // batch of the cached view
	view  gpu.Buffer
	shape []int // cached shape, shape[0] == n
}

func newAct(dev gpu.Device, maxBatch int, sample []int) (*act, error) {
	per := numel(sample)
	b, err := dev.Alloc(maxBatch * per)
	if err != nil {
		return nil, fmt.Errorf("model: allocating %d×%v activations on %s: %w", maxBatch, sample, dev.Name(), err)
	}
	shape := append([]int{maxBatch}, sample...)
	return &act{dev: dev, base: b, per: per, n: maxBatch, view: b, shape: shape}, nil
}

// get returns the tensor for batch n.
func (a *act) get(n int) Tensor {
	if n != a.n {
		if n*a.per > a.base.Len() {
			panic(fmt.Sprintf("model: batch %d exceeds the %d the layer was set up for", n, a.base.Len()/max(a.per, 1)))
		}
		a.view = a.dev.View(a.base, 0, n*a.per)
		a.shape = append(a.shape[:0:0], a.shape...)
		a.shape[0] = n
		a.n = n
	}
	return Tensor{Buf: a.view, Shape: a.shape}
}

func (a *act) free() {
	if a != nil && a.base != nil {
		a.dev.Free(a.base)
		a.base = nil
	}
}
