package cuda

import (
	"fmt"
	"strconv"
)

// EnvBLAS names the environment variable that points at the cuBLAS library
// (a file, or a directory holding it); when set it is the only place searched.
const EnvBLAS = "P2PTRAIN_CUBLAS_LIB"

// cuBLAS constants (cublas_api.h).
const (
	blasOpN         = 0 // CUBLAS_OP_N
	blasOpT         = 1 // CUBLAS_OP_T
	blasDefaultMath = 0 // CUBLAS_DEFAULT_MATH: fp32 compute for Sgemm, no TF32
)

// libMajors returns the CUDA major versions whose libraries (cuBLAS,
// NVRTC) a driver of version driverVersion can run, newest first: the
// driver's own major and the ones before it, down to 11.
func libMajors(driverVersion int) []int {
	top := min(max(driverVersion/1000, 11), 13)
	var ms []int
	for m := top; m >= 11; m-- {
		ms = append(ms, m)
	}
	return ms
}

// blasLib is the cuBLAS library a driver of version driverVersion can use.
func blasLib(driverVersion int) libSpec {
	lib := libSpec{name: "libcublas.so", env: EnvBLAS}
	for _, m := range libMajors(driverVersion) {
		lib.sonames = append(lib.sonames, "libcublas.so."+strconv.Itoa(m))
	}
	lib.files = append(append([]string(nil), lib.sonames...), "libcublas.so")
	lib.name = lib.sonames[0]
	return lib
}

// BLAS is a loaded cuBLAS library.
type BLAS struct {
	lib string

	cublasCreate      func(h *uintptr) int32
	cublasDestroy     func(h uintptr) int32
	cublasSetStream   func(h uintptr, stream uintptr) int32
	cublasSetMathMode func(h uintptr, mode int32) int32
	cublasGetVersion  func(h uintptr, v *int32) int32
	cublasSgemm       func(h uintptr, ta, tb int32, m, n, k int32, alpha *float32, a DevicePtr, lda int32,
		b DevicePtr, ldb int32, beta *float32, c DevicePtr, ldc int32) int32
}

func (b *BLAS) symbols() []symbol {
	return []symbol{
		{name: "cublasCreate_v2", fptr: &b.cublasCreate},
		{name: "cublasDestroy_v2", fptr: &b.cublasDestroy},
		{name: "cublasSetStream_v2", fptr: &b.cublasSetStream},
		{name: "cublasSetMathMode", fptr: &b.cublasSetMathMode},
		{name: "cublasGetVersion_v2", fptr: &b.cublasGetVersion},
		{name: "cublasSgemm_v2", fptr: &b.cublasSgemm},
	}
}

// blasCache holds the cuBLAS libraries loaded, by the path opened.
var blasCache libCache

// LoadBLAS finds and loads cuBLAS (searched like the driver: $P2PTRAIN_CUBLAS_LIB,
// the system library path, SearchDirs, the Python wheels'
// site-packages/nvidia/cublas/lib), preferring the sonames of the CUDA
// major versions a driver of version driverVersion runs. Its errors match
// ErrNoGPU: *LibraryNotFoundError or *SymbolMissingError.
func LoadBLAS(driverVersion int) (*BLAS, error) {
	l, err := blasCache.load(osEnviron(), blasLib(driverVersion), "cuBLAS", func() library { return &BLAS{} })
	if err != nil {
		return nil, err
	}
	return l.(*BLAS), nil
}

func (b *BLAS) loaded(path string) error {
	b.lib = path
	return nil
}

// Path returns the cuBLAS library loaded.
func (b *BLAS) Path() string { return b.lib }

// blasStatusNames names cublasStatus_t codes.
var blasStatusNames = map[int]string{
	0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
	7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
	13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
	16: "CUBLAS_STATUS_LICENSE_ERROR",
}

func blasCheck(fn string, st int32) error {
	if st == 0 {
		return nil
	}
	name, ok := blasStatusNames[int(st)]
	if !ok {
		name = "cublasStatus(" + strconv.Itoa(int(st)) + ")"
	}
	return &StatusError{Component: "cuBLAS", Func: fn, Code: int(st), Name: name}
}

// BLASHandle is a cuBLAS handle bound to one Context's stream, in default
// (fp32, no TF32) math mode. Use it between the Context's Enter and Leave.
type BLASHandle struct {
	b       *BLAS
	h       uintptr
	version int
}

// NewHandle creates a handle for the current context (call it between
// c.Enter and c.Leave) that issues its work on c's stream.
func (b *BLAS) NewHandle(c *Context) (*BLASHandle, error) {
	bh := &BLASHandle{b: b}
	if err := blasCheck("cublasCreate_v2", b.cublasCreate(&bh.h)); err != nil {
		return nil, err
	}
	var v int32
	err := blasCheck("cublasSetStream_v2", b.cublasSetStream(bh.h, c.Stream()))
	if err == nil {
		err = blasCheck("cublasSetMathMode", b.cublasSetMathMode(bh.h, blasDefaultMath))
	}
	if err == nil {
		err = blasCheck("cublasGetVersion_v2", b.cublasGetVersion(bh.h, &v))
	}
	if err != nil {
		b.cublasDestroy(bh.h)
		return nil, err
	}
	bh.version = int(v)
	return bh, nil
}

// Version returns cuBLAS's version, e.g. 120402 for 12.4.2.
func (h *BLASHandle) Version() int { return h.version }

// Destroy releases the handle.
func (h *BLASHandle) Destroy() error { return blasCheck("cublasDestroy_v2", h.b.cublasDestroy(h.h)) }

// GemmArgs are the arguments of one column-major cublasSgemm call: C = α·op(A)·op(B) + β·C
// with op(A) M×K, op(B) K×N and C M×N, all column-major. SwapAB says the
// call's A and B are the row-major caller's B and A.
type GemmArgs struct {
	TransA, TransB bool
	M, N, K        int
	Lda, Ldb, Ldc  int
	SwapAB         bool
}

// RowMajorGemm maps a row-major C = α·op(A)·op(B) + β·C (op(A) m×k, op(B)
// k×n, leading dimensions lda, ldb, ldc as the row-major caller counts them)
// to cuBLAS's column-major convention. A row-major matrix read column-major
// is its transpose, so the call computes Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands
// swap (the call's A is the caller's B), each keeps its own transpose flag
// and leading dimension, and m and n swap.
func RowMajorGemm(transA, transB bool, m, n, k, lda, ldb, ldc int) GemmArgs {
	return GemmArgs{
		TransA: transB, TransB: transA,
		M: n, N: m, K: k,
		Lda: ldb, Ldb: lda, Ldc: ldc,
	}
}

// Sgemm queues one column-major cublasSgemm_v2 call described by g, with
// a and b the call's A and B (so, after RowMajorGemm, the caller's B and A).
func (h *BLASHandle) Sgemm(g GemmArgs, alpha float32, a, b DevicePtr, beta float32, c DevicePtr) error {
	for _, v := range []int{g.M, g.N, g.K, g.Lda, g.Ldb, g.Ldc} {
		if v < 0 || v > 1<<31-1 {
			return fmt.Errorf("cuda: cublasSgemm_v2: dimension %d does not fit a C int", v)
		}
	}
	op := func(t bool) int32 {
		if t {
			return blasOpT
		}
		return blasOpN
	}
	st := h.b.cublasSgemm(h.h, op(g.TransA), op(g.TransB), int32(g.M), int32(g.N), int32(g.K),
		&alpha, a, int32(g.Lda), b, int32(g.Ldb), &beta, c, int32(g.Ldc))
	return blasCheck("cublasSgemm_v2", st)
}
