package gpu

import "fmt"

// LayerNormViews checks LayerNorm's shape (rows ≥ 0, cols > 0) and returns
// each buffer through at, a device's view that panics when a buffer holds
// fewer elements than needed: y and x rows·cols, mean and rstd rows, gamma
// and beta cols. Every Device's LayerNorm validates its arguments with it.
func LayerNormViews[T any](dev string, at func(b Buffer, n int, what string) T, y, mean, rstd, x, gamma, beta Buffer, rows, cols int) (yv, meanv, rstdv, xv, gammav, betav T) {
	if rows < 0 || cols <= 0 {
		panic(fmt.Sprintf("gpu: %s: LayerNorm rows=%d cols=%d", dev, rows, cols))
	}
	return at(y, rows*cols, "LayerNorm y"), at(mean, rows, "LayerNorm mean"), at(rstd, rows, "LayerNorm rstd"),
		at(x, rows*cols, "LayerNorm x"), at(gamma, cols, "LayerNorm gamma"), at(beta, cols, "LayerNorm beta")
}

// LayerNormBackwardViews is LayerNormViews for LayerNormBackward: dx, dy and
// x rows·cols, dgamma, dbeta and gamma cols, mean and rstd rows.
func LayerNormBackwardViews[T any](dev string, at func(b Buffer, n int, what string) T, dx, dgamma, dbeta, dy, x, mean, rstd, gamma Buffer, rows, cols int) (dxv, dgammav, dbetav, dyv, xv, meanv, rstdv, gammav T) {
	if rows < 0 || cols <= 0 {
		panic(fmt.Sprintf("gpu: %s: LayerNormBackward rows=%d cols=%d", dev, rows, cols))
	}
	const w = "LayerNormBackward "
	return at(dx, rows*cols, w+"dx"), at(dgamma, cols, w+"dgamma"), at(dbeta, cols, w+"dbeta"), at(dy, rows*cols, w+"dy"),
		at(x, rows*cols, w+"x"), at(mean, rows, w+"mean"), at(rstd, rows, w+"rstd"), at(gamma, cols, w+"gamma")
}

// EmbeddingViews checks Embedding's shape (rows ≥ 0, vocab > 0, dim > 0)
// and returns its buffers through at: y rows·dim, table vocab·dim, ids rows.
// Every Device's Embedding validates its arguments with it.
func EmbeddingViews[T any](dev string, at func(b Buffer, n int, what string) T, y, table, ids Buffer, rows, vocab, dim int) (yv, tablev, idsv T) {
	if rows < 0 || vocab <= 0 || dim <= 0 {
		panic(fmt.Sprintf("gpu: %s: Embedding rows=%d vocab=%d dim=%d", dev, rows, vocab, dim))
	}
	return at(y, rows*dim, "Embedding y"), at(table, vocab*dim, "Embedding table"), at(ids, rows, "Embedding ids")
}

// EmbeddingBackwardViews is EmbeddingViews for EmbeddingBackward: dtable
// vocab·dim, ids rows, dy rows·dim.
func EmbeddingBackwardViews[T any](dev string, at func(b Buffer, n int, what string) T, dtable, ids, dy Buffer, rows, vocab, dim int) (dtablev, idsv, dyv T) {
	if rows < 0 || vocab <= 0 || dim <= 0 {
		panic(fmt.Sprintf("gpu: %s: EmbeddingBackward rows=%d vocab=%d dim=%d", dev, rows, vocab, dim))
	}
	const w = "EmbeddingBackward "
	return at(dtable, vocab*dim, w+"dtable"), at(ids, rows, w+"ids"), at(dy, rows*dim, w+"dy")
}

// CausalSoftmaxViews checks CausalSoftmax's shape (blocks ≥ 0, t > 0) and
// returns y and x through at, each blocks·t·t elements.
func CausalSoftmaxViews[T any](dev string, at func(b Buffer, n int, what string) T, y, x Buffer, blocks, t int) (yv, xv T) {
	if blocks < 0 || t <= 0 {
		panic(fmt.Sprintf("gpu: %s: CausalSoftmax blocks=%d t=%d", dev, blocks, t))
	}
	n := blocks * t * t
	return at(y, n, "CausalSoftmax y"), at(x, n, "CausalSoftmax x")
}

// CausalSoftmaxBackwardViews is CausalSoftmaxViews for
// CausalSoftmaxBackward: dx, y and dy, each blocks·t·t elements.
func CausalSoftmaxBackwardViews[T any](dev string, at func(b Buffer, n int, what string) T, dx, y, dy Buffer, blocks, t int) (dxv, yv, dyv T) {
	if blocks < 0 || t <= 0 {
		panic(fmt.Sprintf("gpu: %s: CausalSoftmaxBackward blocks=%d t=%d", dev, blocks, t))
	}
	n := blocks * t * t
	const w = "CausalSoftmaxBackward "
	return at(dx, n, w+"dx"), at(y, n, w+"y"), at(dy, n, w+"dy")
}

// TokenIndex returns the integer v holds when it is an index in [0, n), and
// false otherwise (a fraction, a NaN, out of range).
func TokenIndex(v float32, n int) (int, bool) {
	if !(v >= 0 && v < float32(n)) {
		return 0, false
	}
	k := int(v)
	return k, float32(k) == v
}
