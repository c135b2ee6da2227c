// Package gpu is p2ptrain's compute-device layer.
//
// A Device owns memory (Buffers of float32) and runs the kernels the model
// package needs: GEMM with transposes, element-wise operations, the reductions
// of the layers' backward passes, softmax cross-entropy, im2col/col2im for
// convolutions, max pooling, layer normalisation and dropout masks. The CPU
// device is always built and is the default. The CUDA device (package
// gpu/cuda/cudadev) implements the same interface and passes the same
// conformance suite (package gpu/devicetest).
//
// # Opening devices
//
// Open and OpenAll take specs: "cpu", "cpu:N", "cuda" (OpenAll: every GPU)
// and "cuda:N". The CUDA device imports this package, so it cannot be
// imported from here: it registers itself for "cuda" with RegisterOpener
// when a binary links it (cmd/p2ptrain does, with a blank import). In a
// binary that does not, CUDA specs report ErrUnavailable with what the
// driver loader (package gpu/cuda) found. Several devices in one node each
// train on a share of its batch (package model keeps their parameters
// identical); a GPU and a CPU may be mixed.
//
// # Contract
//
//   - Buffers are device-resident. The host reaches their contents only through
//     CopyToDevice and CopyToHost. A Buffer belongs to the Device that made it.
//   - Kernels may run asynchronously, in issue order, on one queue per device.
//     CopyToHost waits for all earlier work on the device before it returns;
//     CopyToDevice may return as soon as the source slice can be reused.
//     Synchronize waits for all issued work and reports any deferred error.
//   - Misuse (a buffer too short, a negative dimension, a Buffer from another
//     device) is a programming error: the methods panic with a "gpu:" message.
//     Resource failures (out of memory, a failed launch) are errors: Alloc
//     returns them at once, Synchronize returns errors discovered later.
//   - Determinism: every operation's reduction order is fixed by the device, so
//     the same inputs on the same device give the same bits, run after run.
//   - A Device may be used by one goroutine at a time; different Devices may be
//     used concurrently.
//   - Tensors are row-major; images are NHWC (batch, height, width, channel).
//     Integer data (class labels, pooling argmax) is carried exactly in float32.
package gpu
