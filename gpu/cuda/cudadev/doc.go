// Package cudadev is the CUDA gpu.Device: one NVIDIA GPU, driven through the
// libraries package gpu/cuda loads at run time (no cgo, no CUDA toolkit at
// build time).
//
// Importing it registers the "cuda" device kind with gpu.Open and
// gpu.OpenAll (gpu.RegisterOpener): "cuda:N" opens GPU N, a bare "cuda" in
// OpenAll every GPU the driver sees. It lives in its own package because it
// implements an interface of package gpu, which itself imports gpu/cuda for
// the driver loader: gpu cannot import it back. A binary that trains on
// GPUs imports it for its side effect (cmd/p2ptrain does).
//
// # How it computes
//
//   - Memory: cuMemAlloc'd float32 buffers; views share them; Alloc zeroes.
//   - GEMM: cublasSgemm_v2 in CUBLAS_DEFAULT_MATH (fp32, no TF32), the
//     row-major product mapped to cuBLAS's column-major one by
//     cuda.RowMajorGemm.
//   - Every other kernel: CUDA C in kernels.cu (KernelSource), compiled by
//     NVRTC when the device opens with -fmad=false, and cached on disk per
//     architecture (cuda.ModuleCache). Each kernel computes one output (or
//     one row or column) per thread and sums in the order the reference
//     loop fixes — SumRows row by row, Col2Im and MaxPoolBackward in the
//     source's row-major order — without atomics, so results are
//     deterministic and, but for the transcendental functions (GELU's
//     erfcf/expf, softmax's exp/log) and GEMM, bit-identical to the CPU
//     device's. DropoutMask reproduces gpu.Uniform exactly.
//   - Order: all work of a Device is queued on one stream. CopyToDevice and
//     CopyToHost wait for their copy (so the host slice may be reused);
//     everything else is asynchronous.
//
// # Threads and errors
//
// The driver keeps its current context per OS thread, so every method
// locks its goroutine to its thread and makes the device's context current
// for the calls it makes (cuda.Context.Enter); devices may be used from
// different goroutines at once, each by one goroutine at a time. The
// gpu.Device methods return no errors: a driver error in an asynchronous
// operation, or bad input a kernel detects (a label that is not a class
// index), is recorded and returned by Synchronize, later work is skipped,
// and CopyToHost gives NaN from then on, so a caller that never
// synchronises still sees the failure as non-finite values. Nothing panics
// on a driver error; misuse panics with a "gpu:" message, as on the CPU.
//
// # Testing without a GPU
//
// The tests run the whole device against stand-in libraries (package
// gpu/cuda/cudatest) that keep device memory on the host and compile
// KernelSource with the host C++ compiler; the same tests run on every real
// GPU where cuda.Enumerate finds one (P2PTRAIN_REQUIRE_GPU=1 makes a
// missing GPU a failure rather than a skip).
package cudadev
