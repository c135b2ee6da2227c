package cudatest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ebitengine/purego"
)

// FakeDeviceAPIC is the device half of the stand-in libcuda, compiled
// together with FakeDriverC: a "GPU" whose memory is host memory (malloc)
// and whose modules are host shared libraries built by the stand-in NVRTC
// from the kernels' CUDA C (see EmulationPrelude). Every call but
// cuCtxSetCurrent fails with CUDA_ERROR_INVALID_CONTEXT (201) unless the
// calling thread made a context current first, so a caller that forgets to
// bind the context to its OS thread is caught. Images that do not start with
// "FAKEMOD:" are refused with CUDA_ERROR_INVALID_IMAGE (200). The exported
// fake_* functions let tests make launches or stream synchronisation fail
// and count live allocations. OMIT_cuLaunchKernel leaves that symbol out.
const FakeDeviceAPIC = `
#include <stdio.h>
#include <stdlib.h>
#include <dlfcn.h>

static __thread long fake_current;
static int fake_launch_result, fake_sync_result, fake_live;

void fake_set_launch_result(int r) { fake_launch_result = r; }
void fake_set_sync_result(int r) { fake_sync_result = r; }
int fake_live_allocs(void) { return fake_live; }

#define NEED_CTX if (!fake_current) return 201

int cuDevicePrimaryCtxRetain(long *ctx, int dev) {
	if (!valid(dev)) return 101;
	*ctx = 0x1000 + dev;
	return 0;
}
int cuDevicePrimaryCtxRelease_v2(int dev) { return valid(dev) ? 0 : 101; }
int cuCtxSetCurrent(long ctx) {
	if (ctx != 0 && !valid((int)(ctx - 0x1000))) return 201;
	fake_current = ctx;
	return 0;
}
int cuStreamCreate(long *s, unsigned flags) { NEED_CTX; *s = 0x5000; return 0; }
int cuStreamDestroy_v2(long s) { NEED_CTX; return s == 0x5000 ? 0 : 400; }
int cuStreamSynchronize(long s) { NEED_CTX; return s == 0x5000 ? fake_sync_result : 400; }
int cuMemAlloc_v2(unsigned long long *p, size_t n) {
	NEED_CTX;
	if (n == 0) return 1;
	void *m = malloc(n);
	if (!m) return 2;
	memset(m, 0xff, n); /* not zeroed, as on a GPU */
	fake_live++;
	*p = (unsigned long long)m;
	return 0;
}
int cuMemFree_v2(unsigned long long p) { NEED_CTX; free((void *)p); fake_live--; return 0; }
int cuMemcpyHtoDAsync_v2(unsigned long long d, const void *s, size_t n, long st) { NEED_CTX; memcpy((void *)d, s, n); return 0; }
int cuMemcpyDtoHAsync_v2(void *d, unsigned long long s, size_t n, long st) { NEED_CTX; memcpy(d, (void *)s, n); return 0; }
int cuMemcpyDtoDAsync_v2(unsigned long long d, unsigned long long s, size_t n, long st) { NEED_CTX; memmove((void *)d, (void *)s, n); return 0; }
int cuMemsetD32Async(unsigned long long d, unsigned v, size_t n, long st) {
	NEED_CTX;
	for (size_t i = 0; i < n; i++) ((unsigned *)d)[i] = v;
	return 0;
}
int cuModuleLoadData(void **m, const char *image) {
	NEED_CTX;
	if (strncmp(image, "FAKEMOD:", 8) != 0) return 200;
	*m = dlopen(image + 8, RTLD_NOW | RTLD_LOCAL);
	return *m ? 0 : 200;
}
int cuModuleUnload(void *m) { NEED_CTX; return 0; /* kept loaded: a reload would reuse it anyway */ }
int cuModuleGetFunction(void **f, void *m, const char *name) {
	char sym[256];
	NEED_CTX;
	snprintf(sym, sizeof sym, "fake_launch_%s", name);
	*f = dlsym(m, sym);
	return *f ? 0 : 500;
}
typedef void (*fake_launcher)(void **params, unsigned gx, unsigned bx);
#ifndef OMIT_cuLaunchKernel
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, long stream, void **params, void **extra) {
	NEED_CTX;
	if (fake_launch_result) return fake_launch_result;
	if (gy != 1 || gz != 1 || by != 1 || bz != 1 || gx == 0 || bx == 0 || bx > 1024 || stream != 0x5000) return 1;
	((fake_launcher)f)(params, gx, bx);
	return 0;
}
#endif
`

// EmulationPrelude is included before the kernels' CUDA C when the stand-in
// NVRTC compiles it with the host C++ compiler: it maps the CUDA built-ins
// the kernels use to host code and defines FAKE_LAUNCHER, which the
// stand-in appends for every __global__ function to export a launcher that
// runs the kernel once per (block, thread) of a 1-D grid, in order.
const EmulationPrelude = `
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <cstddef>
#include <utility>

struct fake_dim3 { unsigned x, y, z; };
static fake_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline

static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }

template <typename... A, std::size_t... I>
static void fake_call(void (*f)(A...), void **p, std::index_sequence<I...>) { f(*static_cast<A *>(p[I])...); }

template <typename... A>
static void fake_run(void (*f)(A...), void **p, unsigned gx, unsigned bx) {
	gridDim = {gx, 1, 1};
	blockDim = {bx, 1, 1};
	for (unsigned b = 0; b < gx; b++)
		for (unsigned t = 0; t < bx; t++) {
			blockIdx = {b, 0, 0};
			threadIdx = {t, 0, 0};
			fake_call(f, p, std::index_sequence_for<A...>{});
		}
}

#define FAKE_LAUNCHER(name) \
	extern "C" void fake_launch_##name(void **p, unsigned gx, unsigned bx) { fake_run(name, p, gx, bx); }
`

// FakeBLASC is the C source of the stand-in libcublas: handles are
// counters, cublasSgemm_v2 is the column-major reference loop on host
// memory (summing in double) and checks the leading dimensions as cuBLAS
// does (CUBLAS_STATUS_INVALID_VALUE, 7). OMIT_<symbol> leaves
// cublasSgemm_v2 or cublasSetMathMode out; fake_blas_math_mode returns the
// last mode set.
const FakeBLASC = `
#include <stddef.h>

static int fake_mode = -1;
int fake_blas_math_mode(void) { return fake_mode; }

int cublasCreate_v2(long *h) { static long next = 0x7000; *h = next++; return 0; }
int cublasDestroy_v2(long h) { return h >= 0x7000 ? 0 : 1; }
int cublasSetStream_v2(long h, long s) { return h >= 0x7000 && s == 0x5000 ? 0 : 7; }
#ifndef OMIT_cublasSetMathMode
int cublasSetMathMode(long h, int mode) { fake_mode = mode; return 0; }
#endif
int cublasGetVersion_v2(long h, int *v) { *v = 120402; return 0; }
#ifndef OMIT_cublasSgemm_v2
int cublasSgemm_v2(long h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, int lda,
                   const float *B, int ldb, const float *beta, float *C, int ldc) {
	int ar = ta ? k : m, br = tb ? n : k;
	if (m < 0 || n < 0 || k < 0 || lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1)) return 7;
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			double s = 0;
			for (int l = 0; l < k; l++) {
				float a = ta ? A[l + (size_t)i * lda] : A[i + (size_t)l * lda];
				float b = tb ? B[j + (size_t)l * ldb] : B[l + (size_t)j * ldb];
				s += (double)a * b;
			}
			float *c = &C[i + (size_t)j * ldc];
			*c = *beta == 0 ? (float)(*alpha * s) : (float)(*alpha * s + (double)*beta * *c);
		}
	return 0;
}
#endif
`

// FakeNVRTCC is the C source of the stand-in libnvrtc (version 12.4,
// supporting sm_75 to sm_90). nvrtcCompileProgram writes the source to a
// temporary directory, appends FAKE_LAUNCHER(name) for every
// "__global__ void name", and compiles it with FAKE_CXX (a macro: the host
// C++ compiler's path) and EmulationPrelude (FAKE_PRELUDE, its path) into a
// shared library; the "PTX" or "cubin" is "FAKEMOD:<its path>". A source
// the host compiler rejects gives NVRTC_ERROR_COMPILATION (6) with the
// compiler's output as the log. An option list without
// --gpu-architecture= gives NVRTC_ERROR_INVALID_OPTION (5).
// fake_nvrtc_compiles counts compilations; fake_nvrtc_options returns the
// last option list, space-separated. OMIT_<symbol> leaves nvrtcGetPTX,
// nvrtcGetCUBIN or nvrtcGetSupportedArchs out.
const FakeNVRTCC = `
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>

typedef struct { char *src, *out, *log; } prog;
static int fake_compiles;
static char fake_opts[4096];
int fake_nvrtc_compiles(void) { return fake_compiles; }
const char *fake_nvrtc_options(void) { return fake_opts; }

int nvrtcVersion(int *major, int *minor) { *major = 12; *minor = 4; return 0; }
const char *nvrtcGetErrorString(int r) {
	switch (r) {
	case 0: return "NVRTC_SUCCESS";
	case 5: return "NVRTC_ERROR_INVALID_OPTION";
	case 6: return "NVRTC_ERROR_COMPILATION";
	}
	return "NVRTC_ERROR_UNKNOWN";
}
int nvrtcCreateProgram(prog **p, const char *src, const char *name, int nh, const char *const *h, const char *const *n) {
	if (!src || nh != 0) return 3;
	*p = calloc(1, sizeof(prog));
	(*p)->src = strdup(src);
	return 0;
}
int nvrtcDestroyProgram(prog **p) {
	free((*p)->src); free((*p)->out); free((*p)->log); free(*p);
	*p = NULL;
	return 0;
}
static char *slurp(const char *path) {
	FILE *f = fopen(path, "rb");
	if (!f) return strdup("");
	char *b = calloc(1, 1 << 20);
	fread(b, 1, (1 << 20) - 1, f);
	fclose(f);
	return b;
}
int nvrtcCompileProgram(prog *p, int n, const char *const *opts) {
	char dir[] = "/tmp/fakenvrtc-XXXXXX", file[256], out[256], logf[256], cmd[2048];
	int arch = 0;
	fake_opts[0] = 0;
	for (int i = 0; i < n; i++) {
		if (strncmp(opts[i], "--gpu-architecture=", 19) == 0) arch = 1;
		if (i) strncat(fake_opts, " ", sizeof fake_opts - strlen(fake_opts) - 1);
		strncat(fake_opts, opts[i], sizeof fake_opts - strlen(fake_opts) - 1);
	}
	if (!arch) return 5;
	if (!mkdtemp(dir)) return 1;
	snprintf(file, sizeof file, "%s/k.cu", dir);
	snprintf(out, sizeof out, "%s/k.so", dir);
	snprintf(logf, sizeof logf, "%s/log", dir);
	FILE *f = fopen(file, "w");
	fputs(p->src, f);
	fputs("\n", f);
	for (const char *s = p->src; (s = strstr(s, "__global__ void ")) != NULL;) {
		s += 16;
		while (*s == ' ') s++;
		const char *e = s;
		while (isalnum((unsigned char)*e) || *e == '_') e++;
		fprintf(f, "FAKE_LAUNCHER(%.*s)\n", (int)(e - s), s);
	}
	fclose(f);
	snprintf(cmd, sizeof cmd, "%s -std=c++14 -shared -fPIC -O1 -include %s -x c++ %s -o %s > %s 2>&1",
	         FAKE_CXX, FAKE_PRELUDE, file, out, logf);
	fake_compiles++;
	int rc = system(cmd);
	p->log = slurp(logf);
	if (rc != 0) return 6;
	p->out = malloc(strlen(out) + 9);
	sprintf(p->out, "FAKEMOD:%s", out);
	return 0;
}
static int size(prog *p, size_t *n) { if (!p->out) return 1; *n = strlen(p->out) + 1; return 0; }
static int get(prog *p, char *b) { if (!p->out) return 1; strcpy(b, p->out); return 0; }
#ifndef OMIT_nvrtcGetPTX
int nvrtcGetPTXSize(prog *p, size_t *n) { return size(p, n); }
int nvrtcGetPTX(prog *p, char *b) { return get(p, b); }
#endif
#ifndef OMIT_nvrtcGetCUBIN
int nvrtcGetCUBINSize(prog *p, size_t *n) { return size(p, n); }
int nvrtcGetCUBIN(prog *p, char *b) { return get(p, b); }
#endif
int nvrtcGetProgramLogSize(prog *p, size_t *n) { *n = p->log ? strlen(p->log) + 1 : 1; return 0; }
int nvrtcGetProgramLog(prog *p, char *b) { strcpy(b, p->log ? p->log : ""); return 0; }
#ifndef OMIT_nvrtcGetSupportedArchs
static const int archs[] = {75, 80, 86, 89, 90};
int nvrtcGetNumSupportedArchs(int *n) { *n = 5; return 0; }
int nvrtcGetSupportedArchs(int *a) { memcpy(a, archs, sizeof archs); return 0; }
#endif
`

// FakeGPU is a set of stand-in CUDA libraries (BuildFakeGPU).
type FakeGPU struct {
	// Driver, BLAS and NVRTC are the libraries' paths.
	Driver, BLAS, NVRTC string
}

// BuildFakeGPU builds the stand-in libcuda.so.1 (FakeDriverC with
// FakeDeviceAPIC), libcublas.so.12 and libnvrtc.so.12 into dir. The extra
// macros go to all three (OMIT_<symbol> leaves a symbol out of whichever
// library has it). It skips the test when no C or C++ compiler is installed.
func BuildFakeGPU(t testing.TB, dir string, defines ...string) FakeGPU {
	t.Helper()
	cxx, err := exec.LookPath("g++")
	if err != nil {
		if cxx, err = exec.LookPath("c++"); err != nil {
			t.Skip("no C++ compiler (g++ or c++) on PATH: the fake NVRTC compiles the kernels with one")
		}
	}
	prelude := filepath.Join(dir, "emulation.h")
	if err := os.WriteFile(prelude, []byte(EmulationPrelude), 0o644); err != nil {
		t.Fatal(err)
	}
	nv := append([]string{fmt.Sprintf("FAKE_CXX=%q", cxx), fmt.Sprintf("FAKE_PRELUDE=%q", prelude)}, defines...)
	return FakeGPU{
		Driver: BuildFake(t, dir, "libcuda.so.1", defines...),
		BLAS:   buildC(t, FakeBLASC, filepath.Join(dir, "libcublas.so.12"), defines),
		NVRTC:  buildC(t, FakeNVRTCC, filepath.Join(dir, "libnvrtc.so.12"), nv),
	}
}

// Call calls the int-returning function sym of the library at path (one of
// the stand-ins' fake_* controls) with integer arguments.
func Call(t testing.TB, path, sym string, args ...uintptr) int {
	t.Helper()
	r, _, _ := purego.SyscallN(lookup(t, path, sym), args...)
	return int(int32(r))
}

// CallString calls the string-returning function sym of the library at path
// (fake_nvrtc_options).
func CallString(t testing.TB, path, sym string) string {
	t.Helper()
	var f func() string
	purego.RegisterFunc(&f, lookup(t, path, sym))
	return f()
}

func lookup(t testing.TB, path, sym string) uintptr {
	t.Helper()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatalf("dlopen %s: %v", path, err)
	}
	addr, err := purego.Dlsym(h, sym)
	if err != nil {
		t.Fatalf("%s: %v", sym, err)
	}
	return addr
}
