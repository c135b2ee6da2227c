package cuda

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrNoGPU is matched (errors.Is) by every error this package returns to
// explain why no GPU is usable.
var ErrNoGPU = errors.New("cuda: no usable GPU")

// LibraryNotFoundError reports that no loadable driver library was found.
type LibraryNotFoundError struct {
	// Name is the library looked for, e.g. "libcuda.so.1".
	Name string
	// Searched lists every place searched, in order.
	Searched []string
	// Failed lists candidates that exist but could not be loaded, each as
	// "path: reason".
	Failed []string
}

// Error implements error.
func (e *LibraryNotFoundError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s not found (searched: %s)", e.Name, strings.Join(e.Searched, ", "))
	if len(e.Failed) > 0 {
		fmt.Fprintf(&b, "; found but could not load: %s", strings.Join(e.Failed, "; "))
	}
	return b.String()
}

// Is reports whether target is ErrNoGPU.
func (e *LibraryNotFoundError) Is(target error) bool { return target == ErrNoGPU }

// SymbolMissingError reports a library (the driver, cuBLAS or NVRTC) that
// lacks a function this package needs.
type SymbolMissingError struct {
	// Component is the library's role: "cuBLAS", "NVRTC", or "" for the
	// CUDA driver.
	Component string
	// Library is the path (or soname) of the library that was loaded.
	Library string
	// Symbol is the missing function, e.g. "cuDeviceGetCount".
	Symbol string
}

// Error implements error.
func (e *SymbolMissingError) Error() string {
	return fmt.Sprintf("%s %s lacks symbol %s", componentName(e.Component), e.Library, e.Symbol)
}

// componentName is how messages name a library's role; "" is the driver.
func componentName(c string) string {
	if c == "" {
		return "CUDA driver"
	}
	return c
}

// Is reports whether target is ErrNoGPU.
func (e *SymbolMissingError) Is(target error) bool { return target == ErrNoGPU }

// DriverTooOldError reports a driver older than MinDriverVersion.
type DriverTooOldError struct {
	// Library is the path (or soname) of the library that was loaded.
	Library string
	// Version is the driver's cuDriverGetVersion, e.g. 10020 for 10.2.
	Version int
	// Min is the oldest version accepted.
	Min int
}

// Error implements error.
func (e *DriverTooOldError) Error() string {
	return fmt.Sprintf("CUDA driver %s is too old: version %s, need %s or newer",
		e.Library, FormatVersion(e.Version), FormatVersion(e.Min))
}

// Is reports whether target is ErrNoGPU.
func (e *DriverTooOldError) Is(target error) bool { return target == ErrNoGPU }

// ResultError reports a driver call that returned a CUresult other than
// CUDA_SUCCESS.
type ResultError struct {
	// Func is the driver function called, e.g. "cuInit".
	Func string
	// Code is the CUresult it returned.
	Code Result
	// Name is the code's symbolic name, e.g. "CUDA_ERROR_NOT_INITIALIZED".
	Name string
}

// Error implements error.
func (e *ResultError) Error() string {
	return fmt.Sprintf("%s failed: %s (%d)", e.Func, e.Name, int32(e.Code))
}

// Is reports whether target is ErrNoGPU.
func (e *ResultError) Is(target error) bool { return target == ErrNoGPU }

// StatusError reports a cuBLAS or NVRTC call that returned a status other
// than success (cublasStatus_t, nvrtcResult).
type StatusError struct {
	// Component is "cuBLAS" or "NVRTC".
	Component string
	// Func is the function called, e.g. "cublasCreate_v2".
	Func string
	// Code is the status it returned.
	Code int
	// Name is the code's symbolic name, e.g. "CUBLAS_STATUS_NOT_INITIALIZED".
	Name string
}

// Error implements error.
func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: %s failed: %s (%d)", e.Component, e.Func, e.Name, e.Code)
}

// Is reports whether target is ErrNoGPU.
func (e *StatusError) Is(target error) bool { return target == ErrNoGPU }

// CompileError reports kernel source that NVRTC would not compile; Log is
// NVRTC's log. It means the installed NVRTC cannot build this program's
// kernels for the device, so it too matches ErrNoGPU.
type CompileError struct {
	// Library is the NVRTC library used.
	Library string
	// Options are the compile options given.
	Options []string
	// Code and Name are nvrtcCompileProgram's result.
	Code int
	Name string
	// Log is the compiler's log.
	Log string
}

// Error implements error.
func (e *CompileError) Error() string {
	return fmt.Sprintf("NVRTC %s: compiling the kernels (%s) failed: %s (%d):\n%s",
		e.Library, strings.Join(e.Options, " "), e.Name, e.Code, strings.TrimSpace(e.Log))
}

// Is reports whether target is ErrNoGPU.
func (e *CompileError) Is(target error) bool { return target == ErrNoGPU }

// NoDeviceError reports a working driver that sees no CUDA device.
type NoDeviceError struct {
	// Library is the path (or soname) of the library that was loaded.
	Library string
	// Reason says how the driver reported it, e.g. "cuDeviceGetCount = 0".
	Reason string
}

// Error implements error.
func (e *NoDeviceError) Error() string {
	return fmt.Sprintf("no CUDA device (%s; driver %s)", e.Reason, e.Library)
}

// Is reports whether target is ErrNoGPU.
func (e *NoDeviceError) Is(target error) bool { return target == ErrNoGPU }

// UnsupportedPlatformError reports a binary without the driver loader: built
// for a GOOS/GOARCH other than linux/amd64 and linux/arm64, or with -tags
// nocuda.
type UnsupportedPlatformError struct {
	// Platform is GOOS/GOARCH.
	Platform string
	// NoCUDATag is true when the binary was built with -tags nocuda.
	NoCUDATag bool
}

// Error implements error.
func (e *UnsupportedPlatformError) Error() string {
	if e.NoCUDATag {
		return "the CUDA loader is not built into this binary (built with -tags nocuda)"
	}
	return fmt.Sprintf("the CUDA loader is not available on %s (linux/amd64 and linux/arm64 only)", e.Platform)
}

// Is reports whether target is ErrNoGPU.
func (e *UnsupportedPlatformError) Is(target error) bool { return target == ErrNoGPU }

// Result is a CUDA driver API status code (CUresult).
type Result int32

// Result codes this package acts on.
const (
	Success             Result = 0   // CUDA_SUCCESS
	ErrorNotInitialized Result = 3   // CUDA_ERROR_NOT_INITIALIZED
	ErrorStubLibrary    Result = 34  // CUDA_ERROR_STUB_LIBRARY
	ErrorNoDevice       Result = 100 // CUDA_ERROR_NO_DEVICE
)

// resultNames maps the CUresult codes a loader or device is likely to meet to
// their names (cuda.h); the driver's own cuGetErrorName covers the rest.
var resultNames = map[Result]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	35:  "CUDA_ERROR_INSUFFICIENT_DRIVER",
	36:  "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
	46:  "CUDA_ERROR_DEVICES_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
	200: "CUDA_ERROR_INVALID_IMAGE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE",
	218: "CUDA_ERROR_INVALID_PTX",
	221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	400: "CUDA_ERROR_INVALID_HANDLE",
	500: "CUDA_ERROR_NOT_FOUND",
	600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	800: "CUDA_ERROR_NOT_PERMITTED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	999: "CUDA_ERROR_UNKNOWN",
}

// String returns the code's name from cuda.h, or "CUresult(N)" for a code
// this package does not know.
func (r Result) String() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return "CUresult(" + strconv.Itoa(int(r)) + ")"
}

// FormatVersion formats a CUDA version number as cuDriverGetVersion reports
// it (1000·major + 10·minor) as "major.minor", e.g. 12040 → "12.4".
func FormatVersion(v int) string {
	return strconv.Itoa(v/1000) + "." + strconv.Itoa(v%1000/10)
}
