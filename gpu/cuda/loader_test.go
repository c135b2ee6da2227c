package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu/cuda/cudatest"
)

// fake builds a stand-in driver (cudatest.BuildFake), skipping the test in a
// binary without the loader.
func fake(t *testing.T, dir, name string, defines ...string) string {
	t.Helper()
	needLoader(t)
	return cudatest.BuildFake(t, dir, name, defines...)
}

// needLoader skips a test that loads libraries in a -tags nocuda build.
func needLoader(t *testing.T) {
	t.Helper()
	if !LoaderBuilt {
		t.Skip("built without the driver loader (-tags nocuda or an unsupported platform)")
	}
}

// TestLibraryMissing checks that a $P2PTRAIN_CUDA_LIB naming no loadable
// library gives a *LibraryNotFoundError that lists it, and that nothing else
// is searched when it is set.
func TestLibraryMissing(t *testing.T) {
	needLoader(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(garbage, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	missing := filepath.Join(empty, "no", "libcuda.so.1")
	for _, tc := range []struct {
		name, env  string
		wantFailed string // a substring of Failed[0], or "" for no failures
	}{
		{name: "nonexistent path", env: missing},
		{name: "directory without it", env: empty},
		{name: "not a shared library", env: garbage, wantFailed: garbage + ": "},
		{name: "directory with a broken one", env: dir, wantFailed: garbage + ": "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvLibrary, tc.env)
			_, err := Enumerate()
			var nf *LibraryNotFoundError
			if !errors.As(err, &nf) {
				t.Fatalf("Enumerate() error = %v (%T), want *LibraryNotFoundError", err, err)
			}
			if !errors.Is(err, ErrNoGPU) {
				t.Errorf("error %v does not match ErrNoGPU", err)
			}
			want := []string{"$" + EnvLibrary + "=" + tc.env}
			if !reflect.DeepEqual(nf.Searched, want) {
				t.Errorf("Searched = %q, want %q (only the explicit place)", nf.Searched, want)
			}
			msg := err.Error()
			if !strings.Contains(msg, "libcuda.so.1 not found") || !strings.Contains(msg, tc.env) {
				t.Errorf("message %q does not say libcuda.so.1 was not found at %s", msg, tc.env)
			}
			switch {
			case tc.wantFailed == "" && len(nf.Failed) != 0:
				t.Errorf("Failed = %q, want none", nf.Failed)
			case tc.wantFailed != "" && (len(nf.Failed) != 1 || !strings.HasPrefix(nf.Failed[0], tc.wantFailed)):
				t.Errorf("Failed = %q, want one entry starting %q", nf.Failed, tc.wantFailed)
			}
		})
	}
}

// TestSymbolMissing checks that a library lacking a required function is
// refused with an error naming that function (and no panic).
func TestSymbolMissing(t *testing.T) {
	for _, sym := range []string{"cuDeviceGetCount", "cuDeviceTotalMem_v2"} {
		t.Run(sym, func(t *testing.T) {
			lib := fake(t, t.TempDir(), "libcuda.so.1", "OMIT_"+sym)
			t.Setenv(EnvLibrary, lib)
			_, err := Enumerate()
			var sm *SymbolMissingError
			if !errors.As(err, &sm) {
				t.Fatalf("Enumerate() error = %v (%T), want *SymbolMissingError", err, err)
			}
			if sm.Symbol != sym || sm.Library != lib {
				t.Errorf("got symbol %q in %q, want %q in %q", sm.Symbol, sm.Library, sym, lib)
			}
			if !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), "lacks symbol "+sym) {
				t.Errorf("error %q does not name the missing symbol or match ErrNoGPU", err)
			}
		})
	}
}

// TestDriverTooOld checks the version gate, which runs before cuInit.
func TestDriverTooOld(t *testing.T) {
	lib := fake(t, t.TempDir(), "libcuda.so.1", "VERSION=10020", "INIT_RESULT=999")
	t.Setenv(EnvLibrary, lib)
	_, err := Load()
	var old *DriverTooOldError
	if !errors.As(err, &old) {
		t.Fatalf("Load() error = %v (%T), want *DriverTooOldError", err, err)
	}
	if old.Version != 10020 || old.Min != MinDriverVersion {
		t.Errorf("got version %d min %d, want 10020 min %d", old.Version, old.Min, MinDriverVersion)
	}
	if msg := err.Error(); !strings.Contains(msg, "version 10.2, need 11.0 or newer") {
		t.Errorf("message %q does not give the versions", msg)
	}
}

// TestInitFails checks cuInit's failures: CUDA_ERROR_NO_DEVICE is a
// *NoDeviceError, any other code a *ResultError naming the code, with the
// driver's cuGetErrorName used for codes the package does not know.
func TestInitFails(t *testing.T) {
	for _, tc := range []struct {
		defines  []string
		noDevice bool
		want     string
	}{
		{defines: []string{"INIT_RESULT=100"}, noDevice: true, want: "no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE (100)"},
		{defines: []string{"INIT_RESULT=3"}, want: "cuInit failed: CUDA_ERROR_NOT_INITIALIZED (3)"},
		{defines: []string{"INIT_RESULT=34"}, want: "cuInit failed: CUDA_ERROR_STUB_LIBRARY (34)"},
		{defines: []string{"INIT_RESULT=12345", "ERROR_NAMES"}, want: "cuInit failed: CUDA_ERROR_FAKE_FOR_TEST (12345)"},
		{defines: []string{"INIT_RESULT=12345"}, want: "cuInit failed: CUresult(12345) (12345)"},
	} {
		t.Run(strings.Join(tc.defines, ","), func(t *testing.T) {
			lib := fake(t, t.TempDir(), "libcuda.so.1", tc.defines...)
			t.Setenv(EnvLibrary, lib)
			_, err := Enumerate()
			if err == nil {
				t.Fatal("Enumerate() succeeded, want an error")
			}
			var nd *NoDeviceError
			var re *ResultError
			switch {
			case tc.noDevice && !errors.As(err, &nd):
				t.Fatalf("error = %v (%T), want *NoDeviceError", err, err)
			case !tc.noDevice && (!errors.As(err, &re) || re.Func != "cuInit"):
				t.Fatalf("error = %v (%T), want a *ResultError from cuInit", err, err)
			}
			if !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), lib) {
				t.Errorf("error %q does not contain %q and the library path", err, tc.want)
			}
		})
	}
}

// TestZeroDevices checks a driver that initialises but counts no device.
func TestZeroDevices(t *testing.T) {
	t.Setenv(EnvLibrary, fake(t, t.TempDir(), "libcuda.so.1", "NDEV=0"))
	_, err := Enumerate()
	var nd *NoDeviceError
	if !errors.As(err, &nd) || !strings.Contains(err.Error(), "cuDeviceGetCount = 0") {
		t.Fatalf("Enumerate() error = %v, want *NoDeviceError saying cuDeviceGetCount = 0", err)
	}
}

// fakeDevices is what the fake driver reports with NDEV=2.
var fakeDevices = []DeviceInfo{
	{Index: 0, Name: "Fake GPU Alpha", TotalMemory: 16 << 30, ComputeMajor: 8, ComputeMinor: 6, Multiprocessors: 132, DriverVersion: 12040},
	{Index: 1, Name: "Fake GPU Beta", TotalMemory: 32 << 30, ComputeMajor: 9, ComputeMinor: 5, Multiprocessors: 132, DriverVersion: 12040},
}

// TestEnumerateFake runs the whole purego call path against the fake driver:
// found by file and by directory, every property read through the C calls.
func TestEnumerateFake(t *testing.T) {
	dir := t.TempDir()
	lib := fake(t, dir, "libcuda.so.1")
	for _, env := range []string{lib, dir} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(EnvLibrary, env)
			d, err := Load()
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if d.Path() != lib || d.Version() != 12040 {
				t.Errorf("Path, Version = %q, %d; want %q, 12040", d.Path(), d.Version(), lib)
			}
			got, err := Enumerate()
			if err != nil {
				t.Fatalf("Enumerate: %v", err)
			}
			if !reflect.DeepEqual(got, fakeDevices) {
				t.Errorf("Enumerate() =\n%+v\nwant\n%+v", got, fakeDevices)
			}
			if s, cc := got[1].Spec(), got[1].ComputeCapability(); s != "cuda:1" || cc != "9.5" {
				t.Errorf("Spec, ComputeCapability = %q, %q; want cuda:1, 9.5", s, cc)
			}
		})
	}
}

// TestEnumerateConcurrent checks that concurrent loads and enumerations are
// safe (run with -race) and agree.
func TestEnumerateConcurrent(t *testing.T) {
	t.Setenv(EnvLibrary, fake(t, t.TempDir(), "libcuda.so.1"))
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			got, err := Enumerate()
			if err == nil && !reflect.DeepEqual(got, fakeDevices) {
				err = fmt.Errorf("got %+v", got)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestSearchPlan checks the search order with a simulated environment.
func TestSearchPlan(t *testing.T) {
	wheels := map[string][]string{
		"/venv/lib/python3*/site-packages/nvidia/*/lib": {"/venv/lib/python3.12/site-packages/nvidia/cublas/lib",
			"/venv/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib"},
		"/usr/lib/python3/dist-packages/nvidia/*/lib": {"/usr/lib/python3/dist-packages/nvidia/cublas/lib"},
	}
	env := func(vars map[string]string, dirs ...string) environ {
		return environ{
			getenv: func(k string) string { return vars[k] },
			glob:   func(p string) ([]string, error) { return wheels[p], nil },
			isDir: func(p string) bool {
				for _, d := range dirs {
					if d == p {
						return true
					}
				}
				return false
			},
		}
	}
	labels := func(plan []place) []string {
		var l []string
		for _, p := range plan {
			l = append(l, p.label)
		}
		return l
	}

	plan := searchPlan(env(map[string]string{EnvLibrary: "/opt/x/libcuda.so.1"}), driverLib)
	if len(plan) != 1 || !reflect.DeepEqual(plan[0].files, []string{"/opt/x/libcuda.so.1"}) {
		t.Errorf("explicit file: plan %+v", plan)
	}
	plan = searchPlan(env(map[string]string{EnvLibrary: "/opt/x"}, "/opt/x"), driverLib)
	if len(plan) != 1 || !reflect.DeepEqual(plan[0].files, []string{"/opt/x/libcuda.so.1", "/opt/x/libcuda.so"}) {
		t.Errorf("explicit directory: plan %+v", plan)
	}

	plan = searchPlan(env(map[string]string{"VIRTUAL_ENV": "/venv"}), driverLib)
	want := append(append([]string{"system library path"}, SearchDirs()...),
		"/venv/lib/python3.12/site-packages/nvidia/cublas/lib",
		"/venv/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib",
		"/usr/lib/python3/dist-packages/nvidia/cublas/lib")
	if got := labels(plan); !reflect.DeepEqual(got, want) {
		t.Errorf("default plan:\n got %q\nwant %q", got, want)
	}
	if !plan[0].system || !reflect.DeepEqual(plan[0].files, []string{LibraryName}) {
		t.Errorf("first place %+v, want the soname through the system linker", plan[0])
	}
	for _, p := range plan {
		for _, f := range p.files {
			if strings.Contains(f, "stubs") {
				t.Errorf("plan searches the stubs directory: %s", f)
			}
		}
	}

	// No wheels: the report still says they were looked for.
	wheels = nil
	got := labels(searchPlan(env(nil), driverLib))
	if last := got[len(got)-1]; !strings.HasPrefix(last, "Python wheels") {
		t.Errorf("last place %q, want the Python-wheel note", last)
	}

	// Bounded: many environments give at most maxWheelDirs directories.
	var many []string
	for i := range 3 * maxWheelDirs {
		many = append(many, fmt.Sprintf("/usr/local/lib/python3.%d/site-packages/nvidia/cublas/lib", i))
	}
	wheels = map[string][]string{"/usr/local/lib/python3*/site-packages/nvidia/*/lib": many}
	if n := len(searchPlan(env(nil), driverLib)) - 1 - len(SearchDirs()); n != maxWheelDirs {
		t.Errorf("%d wheel directories searched, want the bound %d", n, maxWheelDirs)
	}
}

// TestNames checks Result.String and FormatVersion.
func TestNames(t *testing.T) {
	for r, want := range map[Result]string{0: "CUDA_SUCCESS", 100: "CUDA_ERROR_NO_DEVICE", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 7: "CUresult(7)"} {
		if got := r.String(); got != want {
			t.Errorf("Result(%d).String() = %q, want %q", int32(r), got, want)
		}
	}
	for v, want := range map[int]string{12040: "12.4", 11000: "11.0", 10020: "10.2", 13010: "13.1"} {
		if got := FormatVersion(v); got != want {
			t.Errorf("FormatVersion(%d) = %q, want %q", v, got, want)
		}
	}
}

// TestSystemLibraryPath checks the soname step of the search: a child test
// process started with LD_LIBRARY_PATH at a directory holding the fake
// libcuda.so.1, and no $P2PTRAIN_CUDA_LIB, loads it through the dynamic
// linker and reports its file (found from /proc/self/maps).
func TestSystemLibraryPath(t *testing.T) {
	if os.Getenv("P2PTRAIN_CUDA_TEST_CHILD") == "1" {
		devs, err := Enumerate()
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(3)
		}
		d, _ := Load()
		fmt.Printf("LOADED %s %d\n", d.Path(), len(devs))
		return
	}
	dir := t.TempDir()
	lib := fake(t, dir, "libcuda.so.1")
	cmd := exec.Command(os.Args[0], "-test.run=^TestSystemLibraryPath$", "-test.count=1")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, EnvLibrary+"=") && !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+dir, "P2PTRAIN_CUDA_TEST_CHILD=1")
	out, err := cmd.CombinedOutput()
	if want := fmt.Sprintf("LOADED %s 2\n", lib); err != nil || !strings.Contains(string(out), want) {
		t.Fatalf("child: %v; output:\n%s\nwant a line %q", err, out, want)
	}
}
