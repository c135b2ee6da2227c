// Package cudatest builds stand-in CUDA driver libraries for tests, so the
// loader's whole run-time path (dlopen, dlsym, calls through purego) runs on
// machines without a GPU.
package cudatest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// FakeDriverC is the C source of the stand-in libcuda. Macros choose its
// behaviour: INIT_RESULT (cuInit's CUresult, default 0), VERSION
// (cuDriverGetVersion, default 12040), NDEV (device count, default 2),
// ERROR_NAMES (export cuGetErrorName, which names code 12345
// "CUDA_ERROR_FAKE_FOR_TEST") and OMIT_<symbol> to leave cuDeviceGetCount or
// cuDeviceTotalMem_v2 out. Device ordinal i is named "Fake GPU Alpha", "Fake
// GPU Beta", "Fake GPU Gamma" (cycling), has (i+1)·16 GiB, compute capability
// (8+i).(6−i) and 132 multiprocessors. Device handles are 100+ordinal, so a
// loader that passes ordinals where handles are due gets errors.
const FakeDriverC = `
#include <stddef.h>
#include <string.h>

#ifndef INIT_RESULT
#define INIT_RESULT 0
#endif
#ifndef VERSION
#define VERSION 12040
#endif
#ifndef NDEV
#define NDEV 2
#endif

static int valid(int dev) { return dev >= 100 && dev < 100 + NDEV; }

int cuInit(unsigned int flags) { return flags == 0 ? INIT_RESULT : 1; }
int cuDriverGetVersion(int *v) { if (!v) return 1; *v = VERSION; return 0; }
#ifndef OMIT_cuDeviceGetCount
int cuDeviceGetCount(int *n) { if (!n) return 1; *n = NDEV; return 0; }
#endif
int cuDeviceGet(int *dev, int ordinal) {
	if (ordinal < 0 || ordinal >= NDEV) return 101;
	*dev = 100 + ordinal;
	return 0;
}
int cuDeviceGetName(char *name, int len, int dev) {
	static const char *names[] = {"Fake GPU Alpha", "Fake GPU Beta", "Fake GPU Gamma"};
	if (!valid(dev) || len <= 0) return 101;
	strncpy(name, names[(dev - 100) % 3], (size_t)len - 1);
	name[len - 1] = 0;
	return 0;
}
#ifndef OMIT_cuDeviceTotalMem_v2
int cuDeviceTotalMem_v2(size_t *bytes, int dev) {
	if (!valid(dev)) return 101;
	*bytes = ((size_t)(dev - 100) + 1) * ((size_t)16 << 30); /* 16 GiB, 32 GiB, ... */
	return 0;
}
#endif
int cuDeviceGetAttribute(int *v, int attr, int dev) {
	if (!valid(dev)) return 101;
	switch (attr) {
	case 16: *v = 132; return 0;           /* multiprocessors */
	case 75: *v = 8 + (dev - 100); return 0; /* compute major: 8, 9, ... */
	case 76: *v = 6 - (dev - 100); return 0; /* compute minor: 6, 5, ... */
	}
	return 1;
}
#ifdef ERROR_NAMES
int cuGetErrorName(int code, const char **name) {
	if (code == 12345) { *name = "CUDA_ERROR_FAKE_FOR_TEST"; return 0; }
	return 1;
}
#endif
`

// BuildFake compiles FakeDriverC (with FakeDeviceAPIC, the device API that
// runs kernels on the host) with the given macros (e.g. "NDEV=0",
// "OMIT_cuDeviceGetCount") into dir/name and returns its path. It skips the
// test only when no C compiler (gcc or cc) is installed.
func BuildFake(t testing.TB, dir, name string, defines ...string) string {
	t.Helper()
	return buildC(t, FakeDriverC+FakeDeviceAPIC, filepath.Join(dir, name), defines, "-ldl")
}

// compiler returns the C compiler (gcc or cc), skipping the test without one.
func compiler(t testing.TB) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		if cc, err = exec.LookPath("cc"); err != nil {
			t.Skip("no C compiler (gcc or cc) on PATH: the fake-CUDA tests build shared libraries with one")
		}
	}
	return cc
}

// buildC compiles the C source src into the shared library out, with -D
// for each define and extra arguments after the source.
func buildC(t testing.TB, src, out string, defines []string, extra ...string) string {
	t.Helper()
	cc := compiler(t)
	file := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(out), filepath.Ext(out))+".c")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-shared", "-fPIC", "-O1", "-o", out, file}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	args = append(args, extra...)
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", cc, strings.Join(args, " "), err, b)
	}
	return out
}
