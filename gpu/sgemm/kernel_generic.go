//go:build !amd64 || purego

package sgemm

// asmKernel is the assembly micro-kernel, nil where there is none.
var asmKernel kernelFunc
