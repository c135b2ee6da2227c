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
