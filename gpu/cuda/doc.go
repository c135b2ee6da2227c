// Package cuda loads the NVIDIA CUDA driver API (libcuda.so.1) at run time and
// reports the GPUs it can see.
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
// # Errors
//
// Every reason no GPU is usable is a typed error that matches ErrNoGPU with
// errors.Is: *LibraryNotFoundError (lists every place searched and why each
// candidate found failed to load), *SymbolMissingError (names the symbol),
// *DriverTooOldError (driver version against MinDriverVersion),
// *ResultError (a driver call failed: the call, the CUresult code and its
// name), *NoDeviceError (the driver works but sees no device) and
// *UnsupportedPlatformError (no loader in this binary). The package
// never panics on a bad library: every symbol is looked up with Dlsym and
// checked before it is bound.
//
// # Concurrency
//
// Load, Enumerate and the methods of Driver are safe for concurrent use. A
// loaded driver stays loaded for the life of the process (libcuda does not
// support being unloaded).
package cuda
