//go:build !amd64 || purego

package compress

// useAVX2 is false without the amd64 kernels: the pure-Go loops run.
var useAVX2 = false

func absMaxBitsAVX2(p *float32, n int) uint32            { panic("compress: no AVX2 kernels") }
func sumAbsAVX2(src, r *float32, n int, acc *[4]float64) { panic("compress: no AVX2 kernels") }
func packReconAVX2(out *byte, a, r *float32, n int, neg, pos float32) {
	panic("compress: no AVX2 kernels")
}
func oneBitStatsAVX2(grad, r *float32, n int, acc *[16]float64) int {
	panic("compress: no AVX2 kernels")
}
func quantStochAVX2(out *byte, v *float32, n int, c uint64, scale float32, levels int32) {
	panic("compress: no AVX2 kernels")
}

func prepMul4x2AVX2(acc *[8]float32, mp0, mp1, g0, g1, e0, e1, q *float32, m int) {
	panic("compress: no AVX2 kernels")
}

func unpackBitsAVX2(d *float32, bits *byte, n int, neg, pos float32, add bool) {
	panic("compress: no AVX2 kernels")
}

func qsgdPack4AVX2(out *byte, v, u *float32, n int, scale float32, s int32) {
	panic("compress: no AVX2 kernels")
}

func sumSqAVX2(src *float32, n int, acc *[4]float64) { panic("compress: no AVX2 kernels") }

func fillUniformAVX2(u *float32, n int, x uint64) { panic("compress: no AVX2 kernels") }

func qsgdDecode4AVX2(d *float32, codes *byte, n int, scale float32, add bool) {
	panic("compress: no AVX2 kernels")
}
