package gpu

import (
	"fmt"
	"math"
)

// The CPU device's kernels for sequence models: token embeddings and the
// causal softmax of self-attention.

// Embedding gathers table rows by token index.
func (d *CPU) Embedding(y, table, ids Buffer, rows, vocab, dim int) {
	out, tab, id := EmbeddingViews(d.name, d.at, y, table, ids, rows, vocab, dim)
	for i := 0; i < rows; i++ {
		k := d.token(id[i], vocab)
		copy(out[i*dim:i*dim+dim], tab[k*dim:k*dim+dim])
	}
}

// EmbeddingBackward adds the rows of dy into dtable, rows in order.
func (d *CPU) EmbeddingBackward(dtable, ids, dy Buffer, rows, vocab, dim int) {
	tab, id, g := EmbeddingBackwardViews(d.name, d.at, dtable, ids, dy, rows, vocab, dim)
	for i := 0; i < rows; i++ {
		k := d.token(id[i], vocab)
		dst := tab[k*dim : k*dim+dim]
		for j, v := range g[i*dim : i*dim+dim] {
			dst[j] += v
		}
	}
}

func (d *CPU) token(v float32, vocab int) int {
	k, ok := TokenIndex(v, vocab)
	if !ok {
		panic(fmt.Sprintf("gpu: %s: token %v not an index in [0, %d)", d.name, v, vocab))
	}
	return k
}

// CausalSoftmax applies the scaled, causally masked row softmax to t×t blocks.
func (d *CPU) CausalSoftmax(y, x Buffer, blocks, t int, scale float32) {
	out, in := CausalSoftmaxViews(d.name, d.at, y, x, blocks, t)
	sc := float64(scale)
	for r := 0; r < blocks*t; r++ {
		i := r % t // the row within its block: columns 0..i are visible
		xr, yr := in[r*t:r*t+t], out[r*t:r*t+t]
		m := math.Inf(-1)
		for _, v := range xr[:i+1] {
			m = max(m, sc*float64(v))
		}
		var sum float64
		for _, v := range xr[:i+1] {
			sum += math.Exp(sc*float64(v) - m)
		}
		for j := 0; j <= i; j++ {
			yr[j] = float32(math.Exp(sc*float64(xr[j])-m) / sum)
		}
		clear(yr[i+1:])
	}
}

// CausalSoftmaxBackward computes CausalSoftmax's input gradient from its output.
func (d *CPU) CausalSoftmaxBackward(dx, y, dy Buffer, blocks, t int, scale float32) {
	gx, out, g := CausalSoftmaxBackwardViews(d.name, d.at, dx, y, dy, blocks, t)
	sc := float64(scale)
	for r := 0; r < blocks*t; r++ {
		i := r % t
		yr, gr, xr := out[r*t:r*t+t], g[r*t:r*t+t], gx[r*t:r*t+t]
		var dot float64
		for j := 0; j <= i; j++ {
			dot += float64(yr[j]) * float64(gr[j])
		}
		for j := 0; j <= i; j++ {
			xr[j] = float32(sc * float64(yr[j]) * (float64(gr[j]) - dot))
		}
		clear(xr[i+1:])
	}
}
