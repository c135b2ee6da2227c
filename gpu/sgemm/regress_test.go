package sgemm

import "testing"

// TestThreadedTransposedAShortK is the Linear layer's weight gradient (dW =
// xᵀ·dy: op(A) = Aᵀ with A stored k×m, k = batch) at a size that the
// threaded path splits by rows. Slicing A's row band must not assume A is m×k.
func TestThreadedTransposedAShortK(t *testing.T) {
	const m, n, k = 1024, 1024, 64
	a := make([]float32, k*m)
	b := make([]float32, k*n)
	for i := range a {
		a[i] = float32(i%7) - 3
	}
	for i := range b {
		b[i] = float32(i%5) - 2
	}
	c := make([]float32, m*n)
	Sgemm(true, false, m, n, k, 1, a, m, b, n, 0, c, n)
	for _, ij := range [][2]int{{0, 0}, {m - 1, n - 1}, {517, 3}, {3, 900}} {
		i, j := ij[0], ij[1]
		var want float32
		for l := 0; l < k; l++ {
			want += a[l*m+i] * b[l*n+j]
		}
		if c[i*n+j] != want {
			t.Fatalf("C[%d][%d] = %v, want %v", i, j, c[i*n+j], want)
		}
	}
}
