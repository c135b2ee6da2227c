// Package cuda loads the NVIDIA CUDA driver API (libcuda.so.1), cuBLAS and
// NVRTC at run time, reports the GPUs it can see, and wraps what a compute
// device needs of them: a Context (a device's primary context and stream:
// memory, copies, modules, kernel launches), a BLASHandle (Sgemm, with
// RowMajorGemm mapping row-major products onto cuBLAS's column-major ones)
// and NVRTC compilation with an on-disk ModuleCache. The gpu.Device built
// on them is package gpu/cuda/cudadev; this package does not import gpu.
//
// The library is opened with dlopen through github.com/ebitengine/purego, so
// the default build needs neither cgo nor the CUDA toolkit: a binary built
// with CGO_ENABLED=0 starts on any glibc-based Linux machine and finds the driver, if there is
// one, when it first asks for it. Such a binary is dynamically linked (purego
// needs the system's dynamic loader, /lib64/ld-linux-x86-64.so.2 or
// /lib/ld-linux-aarch64.so.1); build with -tags nocuda for a fully static
// binary without the loader, whose CUDA specs then report
// *UnsupportedPlatformError. The loader is built for linux/amd64 and
// linux/arm64 only.
//
// # Where the driver is looked for
//
//  1. $P2PTRAIN_CUDA_LIB, when set: the library file itself, or a directory
//     holding libcuda.so.1 (or libcuda.so). It is then the only place
//     searched, so a wrong value is reported rather than silently replaced by
//     another driver.
//  2. The system library path: dlopen("libcuda.so.1"), which honours
//     LD_LIBRARY_PATH and the ld.so cache.
//  3. The usual locations (SearchDirs): the distribution's library
//     directories, the CUDA toolkit's lib64 and targets directories, WSL's
//     /usr/lib/wsl/lib, then a bounded set of Python-wheel directories
//     (site-packages/nvidia/*/lib under the active virtualenv or conda
//     environment, /usr, /usr/local, /opt/conda and ~/.local).
//
// The toolkit's stubs directory is never searched: its libcuda.so only
// answers CUDA_ERROR_STUB_LIBRARY.
//
// cuBLAS (LoadBLAS) and NVRTC (LoadNVRTC) are searched the same way, with
// $P2PTRAIN_CUBLAS_LIB and $P2PTRAIN_NVRTC_LIB in place of
// $P2PTRAIN_CUDA_LIB, for the sonames of the CUDA major versions the driver
// runs, newest first (libcublas.so.12, libcublas.so.11; libnvrtc.so.12,
// libnvrtc.so.11.2, …); the Python wheels' nvidia/cublas/lib and
// nvidia/cuda_nvrtc/lib are among the wheel directories. The driver's
// device API (contexts, memory, modules, launches) is bound on the first
// OpenContext, so a library that only enumerates still lists its GPUs.
//
// # Compiled kernels
//
// NVRTC compiles for the device's exact architecture to a cubin where it
// knows it, else to PTX for the newest architecture it knows below it
// (ChooseTarget). Images are cached under DefaultCacheDir
// ($P2PTRAIN_CUDA_CACHE, else $XDG_CACHE_HOME/p2ptrain/cuda or
// ~/.cache/p2ptrain/cuda; "off" disables), keyed by the target, the NVRTC
// version, the options and the source's SHA-256, each entry checksummed and
// written atomically; an entry that is corrupt, or that the driver refuses,
// is compiled again.
//
// # Errors
//
// Every reason no GPU is usable is a typed error that matches ErrNoGPU with
// errors.Is: *LibraryNotFoundError (lists every place searched and why each
// candidate found failed to load), *SymbolMissingError (names the symbol),
// *DriverTooOldError (driver version against MinDriverVersion),
// *ResultError (a driver call failed: the call, the CUresult code and its
// name), *StatusError (a cuBLAS or NVRTC call failed), *CompileError (NVRTC
// rejected the kernels; it carries the log), *NoDeviceError (the driver
// works but sees no device) and *UnsupportedPlatformError (no loader in
// this binary). The package
// never panics on a bad library: every symbol is looked up with Dlsym and
// checked before it is bound.
//
// # Concurrency
//
// Load, LoadBLAS, LoadNVRTC, Enumerate and the methods of Driver, BLAS and
// NVRTC are safe for concurrent use; a Context (and a BLASHandle on it) is
// used by one goroutine at a time, between its Enter and Leave. A
// loaded driver stays loaded for the life of the process (libcuda does not
// support being unloaded).
package cuda
