package sgemm

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func benchOperands(m, n, k int) (a, b, c []float32) {
	rnd := rand.New(rand.NewPCG(9, 10))
	fill := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(rnd.NormFloat64())
		}
		return s
	}
	return fill(m * k), fill(k * n), fill(m * n)
}

func reportGFLOPS(b *testing.B, m, n, k int) {
	b.ReportMetric(2*float64(m)*float64(n)*float64(k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkSgemm measures square products for each transpose combination with
// each micro-kernel, reporting GFLOP/s. SetBytes counts the operands once.
func BenchmarkSgemm(b *testing.B) {
	for _, kn := range kernels() {
		for _, tr := range []struct {
			name           string
			transA, transB bool
		}{{"NN", false, false}, {"NT", false, true}, {"TN", true, false}, {"TT", true, true}} {
			for _, size := range []int{64, 256, 1024} {
				b.Run(fmt.Sprintf("%s/%s/%d", kn.name, tr.name, size), func(b *testing.B) {
					m, n, k := size, size, size
					a, bb, c := benchOperands(m, n, k)
					b.SetBytes(int64(4 * (m*k + k*n + m*n)))
					withKernel(kn, func() {
						for b.Loop() {
							Sgemm(tr.transA, tr.transB, m, n, k, 1, a, k, bb, n, 0, c, n)
						}
					})
					reportGFLOPS(b, m, n, k)
				})
			}
		}
	}
}

// BenchmarkSgemmNaive measures the reference loop, for comparison.
func BenchmarkSgemmNaive(b *testing.B) {
	for _, size := range []int{64, 256} {
		b.Run(fmt.Sprintf("NN/%d", size), func(b *testing.B) {
			m, n, k := size, size, size
			a, bb, c := benchOperands(m, n, k)
			b.SetBytes(int64(4 * (m*k + k*n + m*n)))
			for b.Loop() {
				reference(false, false, m, n, k, 1, a, k, bb, n, 0, c, n)
			}
			reportGFLOPS(b, m, n, k)
		})
	}
}

// BenchmarkSgemmSmall measures the shapes of a small Linear layer, where
// packing overhead matters most.
func BenchmarkSgemmSmall(b *testing.B) {
	for _, d := range [][3]int{{1, 64, 64}, {8, 8, 8}, {16, 16, 16}, {32, 10, 128}} {
		m, n, k := d[0], d[1], d[2]
		b.Run(fmt.Sprintf("%dx%dx%d", m, n, k), func(b *testing.B) {
			a, bb, c := benchOperands(m, n, k)
			for b.Loop() {
				Sgemm(false, false, m, n, k, 1, a, k, bb, n, 0, c, n)
			}
			reportGFLOPS(b, m, n, k)
		})
	}
}
