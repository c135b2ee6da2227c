package cuda

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu/cuda/cudatest"
)

// refGemm is the row-major reference: C = alpha·op(A)·op(B) + beta·C.
func refGemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := range m {
		for j := range n {
			var s float64
			for l := range k {
				ai, bi := i*lda+l, l*ldb+j
				if tA {
					ai = l*lda + i
				}
				if tB {
					bi = j*ldb + l
				}
				x, y := a[ai], b[bi]
				s += float64(x) * float64(y)
			}
			c[i*ldc+j] = float32(float64(alpha)*s + float64(beta)*float64(c[i*ldc+j]))
		}
	}
}

// colMajorGemm is BLAS's column-major Sgemm reference, with the argument
// checks cuBLAS makes (ld ≥ max(1, rows)).
func colMajorGemm(t *testing.T, g GemmArgs, alpha float32, a, b []float32, beta float32, c []float32) {
	t.Helper()
	ar, br := g.M, g.K
	if g.TransA {
		ar = g.K
	}
	if g.TransB {
		br = g.N
	}
	if g.Lda < max(1, ar) || g.Ldb < max(1, br) || g.Ldc < max(1, g.M) {
		t.Fatalf("cuBLAS would refuse %+v (CUBLAS_STATUS_INVALID_VALUE)", g)
	}
	for j := range g.N {
		for i := range g.M {
			var s float64
			for l := range g.K {
				ai, bi := i+l*g.Lda, l+j*g.Ldb
				if g.TransA {
					ai = l + i*g.Lda
				}
				if g.TransB {
					bi = j + l*g.Ldb
				}
				x, y := a[ai], b[bi]
				s += float64(x) * float64(y)
			}
			c[i+j*g.Ldc] = float32(float64(alpha)*s + float64(beta)*float64(c[i+j*g.Ldc]))
		}
	}
}

// TestRowMajorGemm checks the row-major → column-major mapping without a
// GPU: BLAS's column-major loop, called with RowMajorGemm's arguments and
// the operands swapped, gives the row-major reference's bits, for every
// transpose and padded strides.
func TestRowMajorGemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dims := range [][3]int{{1, 1, 1}, {3, 5, 7}, {7, 3, 5}, {16, 1, 9}, {1, 16, 9}, {33, 17, 2}} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			for _, pad := range []int{0, 3} {
				m, n, k, tA, tB := dims[0], dims[1], dims[2], tr[0], tr[1]
				ar, ac, br, bc := m, k, k, n
				if tA {
					ar, ac = k, m
				}
				if tB {
					br, bc = n, k
				}
				lda, ldb, ldc := ac+pad, bc+pad, n+pad
				rnd := func(l int) []float32 {
					s := make([]float32, l)
					for i := range s {
						s[i] = rng.Float32()*2 - 1
					}
					return s
				}
				a, b, c := rnd(ar*lda), rnd(br*ldb), rnd(m*ldc)
				want := append([]float32(nil), c...)
				refGemm(tA, tB, m, n, k, 0.75, a, lda, b, ldb, -0.5, want, ldc)
				g := RowMajorGemm(tA, tB, m, n, k, lda, ldb, ldc)
				colMajorGemm(t, g, 0.75, b, a, -0.5, c)
				if !reflect.DeepEqual(c, want) {
					t.Errorf("m,n,k=%d,%d,%d tA=%v tB=%v pad=%d: args %+v give a different C", m, n, k, tA, tB, pad, g)
				}
			}
		}
	}
}

// TestChooseTarget checks the choice between a cubin and PTX.
func TestChooseTarget(t *testing.T) {
	archs := []int{75, 80, 86, 89, 90}
	for _, tc := range []struct {
		cc        int
		supported []int
		cubin     bool
		want      string
	}{
		{86, archs, true, "sm_86"},
		{90, archs, true, "sm_90"},
		{86, archs, false, "compute_86"}, // an NVRTC without nvrtcGetCUBIN
		{95, archs, true, "compute_90"},  // newer than NVRTC knows: PTX the driver JIT-compiles
		{120, archs, true, "compute_90"}, // likewise
		{87, archs, true, "compute_86"},  // an arch between two it knows
		{70, archs, true, "compute_75"},  // older than any it supports: its oldest
		{80, nil, true, "sm_80"},         // NVRTC before 11.2 cannot list its archs
		{80, nil, false, "compute_80"},   // nor, before 11.1, emit cubins
		{61, []int{52, 61, 70}, true, "sm_61"},
	} {
		if got := ChooseTarget(tc.cc, tc.supported, tc.cubin).String(); got != tc.want {
			t.Errorf("ChooseTarget(%d, %v, %v) = %s, want %s", tc.cc, tc.supported, tc.cubin, got, tc.want)
		}
	}
}

// TestLibrarySonames checks which sonames each driver version tries.
func TestLibrarySonames(t *testing.T) {
	for _, tc := range []struct {
		driver      int
		blas, nvrtc []string
	}{
		{12040, []string{"libcublas.so.12", "libcublas.so.11"}, []string{"libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so.11.1", "libnvrtc.so.11.0"}},
		{13000, []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11"}, []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so.11.1", "libnvrtc.so.11.0"}},
		{11080, []string{"libcublas.so.11"}, []string{"libnvrtc.so.11.2", "libnvrtc.so.11.1", "libnvrtc.so.11.0"}},
	} {
		b, n := blasLib(tc.driver), nvrtcLib(tc.driver)
		if !reflect.DeepEqual(b.sonames, tc.blas) || !reflect.DeepEqual(n.sonames, tc.nvrtc) {
			t.Errorf("driver %d: cuBLAS %v, NVRTC %v; want %v, %v", tc.driver, b.sonames, n.sonames, tc.blas, tc.nvrtc)
		}
		if last := b.files[len(b.files)-1]; last != "libcublas.so" || n.files[len(n.files)-1] != "libnvrtc.so" {
			t.Errorf("driver %d: directories are not searched for the unversioned names last", tc.driver)
		}
	}
}

// TestLibrariesMissing checks that a cuBLAS or NVRTC that cannot be found
// is a *LibraryNotFoundError naming it and the place searched.
func TestLibrariesMissing(t *testing.T) {
	needLoader(t)
	for _, tc := range []struct {
		env, name string
		load      func() error
	}{
		{EnvBLAS, "libcublas.so.12", func() error { _, err := LoadBLAS(12040); return err }},
		{EnvNVRTC, "libnvrtc.so.12", func() error { _, err := LoadNVRTC(12040); return err }},
	} {
		missing := filepath.Join(t.TempDir(), "nothing-here.so")
		t.Setenv(tc.env, missing)
		err := tc.load()
		var nf *LibraryNotFoundError
		if !errors.As(err, &nf) || nf.Name != tc.name || !reflect.DeepEqual(nf.Searched, []string{"$" + tc.env + "=" + missing}) {
			t.Fatalf("%s: error %v (%T), want a *LibraryNotFoundError for %s at %s only", tc.env, err, err, tc.name, missing)
		}
		if !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), tc.name+" not found") {
			t.Errorf("%s: %q does not match ErrNoGPU or name the library", tc.env, err)
		}
	}
}

// TestLibrariesSymbolMissing checks required symbols of cuBLAS, NVRTC and
// the driver's device API, and that NVRTC's optional ones may be absent.
func TestLibrariesSymbolMissing(t *testing.T) {
	needLoader(t)
	for _, tc := range []struct {
		omit, component, symbol string
		load                    func(f cudatest.FakeGPU) error
	}{
		{"cublasSgemm_v2", "cuBLAS", "cublasSgemm_v2", func(f cudatest.FakeGPU) error { _, err := LoadBLAS(12040); return err }},
		{"cublasSetMathMode", "cuBLAS", "cublasSetMathMode", func(f cudatest.FakeGPU) error { _, err := LoadBLAS(12040); return err }},
		{"nvrtcGetPTX", "NVRTC", "nvrtcGetPTXSize", func(f cudatest.FakeGPU) error { _, err := LoadNVRTC(12040); return err }},
		{"cuLaunchKernel", "", "cuLaunchKernel", func(f cudatest.FakeGPU) error {
			d, err := Load()
			if err != nil {
				return err
			}
			if _, err := d.Devices(); err != nil {
				t.Errorf("a driver without the device API should still enumerate: %v", err)
			}
			_, err = d.OpenContext(0)
			return err
		}},
	} {
		t.Run(tc.omit, func(t *testing.T) {
			f := fakeLibs(t, "OMIT_"+tc.omit)
			err := tc.load(f)
			var sm *SymbolMissingError
			if !errors.As(err, &sm) || sm.Component != tc.component || sm.Symbol != tc.symbol {
				t.Fatalf("error %v (%T), want a *SymbolMissingError for %s %s", err, err, tc.component, tc.symbol)
			}
			if !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), componentName(tc.component)+" ") ||
				!strings.Contains(err.Error(), "lacks symbol "+tc.symbol) {
				t.Errorf("%q does not match ErrNoGPU or name the library and symbol", err)
			}
		})
	}
	t.Run("optional", func(t *testing.T) {
		fakeLibs(t, "OMIT_nvrtcGetCUBIN", "OMIT_nvrtcGetSupportedArchs")
		n, err := LoadNVRTC(12040)
		if err != nil {
			t.Fatal(err)
		}
		if n.HasCUBIN() || n.SupportedArchs() != nil || n.Version() != "12.4" {
			t.Errorf("HasCUBIN %v, SupportedArchs %v, Version %s; want false, nil, 12.4", n.HasCUBIN(), n.SupportedArchs(), n.Version())
		}
		if _, err := n.Compile("int x;", "x.cu", Target{Arch: 80, CUBIN: true}, nil); err == nil {
			t.Error("a cubin from an NVRTC without nvrtcGetCUBIN")
		}
	})
}

// fakeLibs builds the stand-in libraries and points every loader at them.
func fakeLibs(t *testing.T, defines ...string) cudatest.FakeGPU {
	t.Helper()
	needLoader(t)
	f := cudatest.BuildFakeGPU(t, t.TempDir(), defines...)
	t.Setenv(EnvLibrary, f.Driver)
	t.Setenv(EnvBLAS, f.BLAS)
	t.Setenv(EnvNVRTC, f.NVRTC)
	return f
}

// TestNVRTCCompile checks options, outputs and a compile error's log.
func TestNVRTCCompile(t *testing.T) {
	f := fakeLibs(t)
	n, err := LoadNVRTC(12040)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.SupportedArchs(); !reflect.DeepEqual(got, []int{75, 80, 86, 89, 90}) || !n.HasCUBIN() {
		t.Errorf("SupportedArchs %v, HasCUBIN %v", got, n.HasCUBIN())
	}
	img, err := n.Compile(`extern "C" __global__ void k(float *x) { x[threadIdx.x] = 1; }`, "k.cu", Target{Arch: 86, CUBIN: true}, []string{"-fmad=false"})
	if err != nil || !strings.HasPrefix(string(img), "FAKEMOD:") {
		t.Fatalf("Compile = %q, %v", img, err)
	}
	if opts := cudatest.CallString(t, f.NVRTC, "fake_nvrtc_options"); opts != "--gpu-architecture=sm_86 -fmad=false" {
		t.Errorf("options %q", opts)
	}
	_, err = n.Compile("this is not C++", "bad.cu", Target{Arch: 90}, nil)
	var ce *CompileError
	if !errors.As(err, &ce) || ce.Name != "NVRTC_ERROR_COMPILATION" || !strings.Contains(ce.Log, "error") ||
		!strings.Contains(err.Error(), "--gpu-architecture=compute_90") {
		t.Fatalf("bad source: %v (%T), want a *CompileError with the log", err, err)
	}
}
