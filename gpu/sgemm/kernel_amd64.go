//go:build amd64 && !purego

package sgemm

import "golang.org/x/sys/cpu"

// asmKernel is the assembly micro-kernel, nil where the CPU lacks AVX2 or FMA.
var asmKernel kernelFunc

// asmPack says whether packing uses the AVX2 transposes; tests switch it off.
var asmPack bool

func init() {
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		asmKernel = kernelAVX2
		microKernel = kernelAVX2
		asmPack = true
	}
}

// kernelAVX2 is the AVX2/FMA micro-kernel (see kernelFunc). Products are
// fused into the sums (FMA), so its results may differ from kernelGo's in the
// last bits.
func kernelAVX2(kc int, a, b, c []float32, ldc int, alpha, beta float32, load bool) {
	_ = a[kc*mr-1]
	_ = b[kc*nr-1]
	_ = c[(mr-1)*ldc+nr-1]
	kernel6x16(kc, &a[0], &b[0], &c[0], ldc, alpha, beta, load)
}

// kernel6x16 is kernelAVX2 without bounds checks; kc must be at least 1.
//
//go:noescape
func kernel6x16(kc int, a, b, c *float32, ldc int, alpha, beta float32, load bool)
