//go:build !amd64 || purego

package sgemm

// asmKernel is the assembly micro-kernel, nil where there is none.
var asmKernel kernelFunc

// asmPack says whether packing uses assembly; there is none in this build.
var asmPack = false

func packTransposeA(d, s0 []float32, ld, kc int) int { return 0 }

func packTransposeB(d, s0 []float32, ld, kc int) int { return 0 }

func packCopyA(d, s0 []float32, ld, kc int) bool { return false }

func packCopyB(d, s0 []float32, ld, kc int) bool { return false }
