package main

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu/cuda"
	"github.com/p2ptrain/p2ptrain/gpu/cuda/cudatest"
)

// TestDevicesNoGPU checks `p2ptrain devices` where the driver library is
// missing: exit 0, the cpu listed, and the loader's exact reason, in text and
// JSON.
func TestDevicesNoGPU(t *testing.T) {
	needCUDALoader(t)
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	t.Setenv(cuda.EnvLibrary, missing)

	code, out, errOut := runCLI(t, "devices")
	if code != 0 || errOut != "" {
		t.Fatalf("devices: exit %d, stderr %q; want 0 and nothing", code, errOut)
	}
	for _, want := range []string{"DEVICE", "\ncpu ", "cuda: no usable GPU: libcuda.so.1 not found (searched: $P2PTRAIN_CUDA_LIB=" + missing + ")"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	code, out, _ = runCLI(t, "devices", "--json")
	if code != 0 {
		t.Fatalf("devices --json: exit %d", code)
	}
	var rep devicesReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("devices --json printed invalid JSON: %v\n%s", err, out)
	}
	if len(rep.Devices) != 1 || rep.Devices[0].Spec != "cpu" || rep.Devices[0].Cores <= 0 {
		t.Errorf("devices = %+v, want only cpu with its cores", rep.Devices)
	}
	if rep.CUDA.Usable || rep.CUDA.Reason != "library_not_found" || !strings.Contains(rep.CUDA.Error, missing) {
		t.Errorf("cuda = %+v, want unusable, library_not_found, naming %s", rep.CUDA, missing)
	}
}

// TestDevicesFakeGPUs runs `p2ptrain devices` against stand-in driver,
// cuBLAS and NVRTC libraries whose driver reports two GPUs, through the real
// loader.
func TestDevicesFakeGPUs(t *testing.T) {
	needCUDALoader(t)
	fake := cudatest.BuildFakeGPU(t, t.TempDir())
	lib := fake.Driver
	t.Setenv(cuda.EnvLibrary, lib)
	t.Setenv(cuda.EnvBLAS, fake.BLAS)
	t.Setenv(cuda.EnvNVRTC, fake.NVRTC)

	code, out, _ := runCLI(t, "devices")
	if code != 0 {
		t.Fatalf("devices: exit %d", code)
	}
	for _, want := range []string{
		`(?m)^cuda:0\s+Fake GPU Alpha\s+16\.0 GiB\s+8\.6\s+132$`,
		`(?m)^cuda:1\s+Fake GPU Beta\s+32\.0 GiB\s+9\.5\s+132$`,
		`(?m)^cuda: driver 12\.4 \(` + regexp.QuoteMeta(lib) + `\)$`,
		`(?m)^cuda: cuBLAS ` + regexp.QuoteMeta(fake.BLAS) + `, NVRTC ` + regexp.QuoteMeta(fake.NVRTC) + `; train on them with devices = \["cuda"\]$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("output does not match %s:\n%s", want, out)
		}
	}

	_, out, _ = runCLI(t, "devices", "--json")
	var rep devicesReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("invalid JSON: %v\n%s", err, out)
	}
	wantCUDA := cudaStatus{Usable: true, Library: lib, DriverVersion: "12.4", CUBLAS: fake.BLAS, NVRTC: fake.NVRTC}
	if rep.CUDA != wantCUDA {
		t.Errorf("cuda = %+v, want %+v", rep.CUDA, wantCUDA)
	}
	want := []deviceEntry{
		{Spec: "cuda:0", Kind: "cuda", Name: "Fake GPU Alpha", TotalMemoryBytes: 16 << 30, ComputeCapability: "8.6", Multiprocessors: 132},
		{Spec: "cuda:1", Kind: "cuda", Name: "Fake GPU Beta", TotalMemoryBytes: 32 << 30, ComputeCapability: "9.5", Multiprocessors: 132},
	}
	if len(rep.Devices) != 3 || !reflect.DeepEqual(rep.Devices[1:], want) {
		t.Errorf("devices = %+v, want cpu then %+v", rep.Devices, want)
	}
}

// TestDevicesWithoutTrainingLibs checks that GPUs the driver reports are
// listed but not usable when cuBLAS or NVRTC is missing, naming the library.
func TestDevicesWithoutTrainingLibs(t *testing.T) {
	needCUDALoader(t)
	dir := t.TempDir()
	fake := cudatest.BuildFakeGPU(t, dir)
	t.Setenv(cuda.EnvLibrary, fake.Driver)
	for _, tc := range []struct {
		name, blas, nvrtc, want string
	}{
		{"no cuBLAS", filepath.Join(dir, "none", "libcublas.so.12"), fake.NVRTC, "libcublas.so.12 not found"},
		{"no NVRTC", fake.BLAS, filepath.Join(dir, "none", "libnvrtc.so.12"), "libnvrtc.so.12 not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(cuda.EnvBLAS, tc.blas)
			t.Setenv(cuda.EnvNVRTC, tc.nvrtc)
			code, out, _ := runCLI(t, "devices")
			if code != 0 || !strings.Contains(out, "cuda:0") || !strings.Contains(out, "cuda: no usable GPU: ") || !strings.Contains(out, tc.want) {
				t.Errorf("devices: exit %d, want 0, cuda:0 listed and no usable GPU for want of %s:\n%s", code, tc.want, out)
			}
			_, out, _ = runCLI(t, "devices", "--json")
			var rep devicesReport
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("invalid JSON: %v\n%s", err, out)
			}
			if rep.CUDA.Usable || rep.CUDA.Reason != "library_not_found" || len(rep.Devices) != 3 {
				t.Errorf("report = %+v, want 3 devices, unusable, library_not_found", rep)
			}
		})
	}
}

// TestDevicesReasons checks the JSON reason for each loader failure.
func TestDevicesReasons(t *testing.T) {
	needCUDALoader(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		defines []string
		reason  string
	}{
		{[]string{"OMIT_cuDeviceGetCount"}, "symbol_missing"},
		{[]string{"VERSION=10020"}, "driver_too_old"},
		{[]string{"INIT_RESULT=100"}, "no_device"},
		{[]string{"NDEV=0"}, "no_device"},
		{[]string{"INIT_RESULT=999"}, "driver_error"},
	} {
		t.Run(tc.reason+"/"+strings.Join(tc.defines, ","), func(t *testing.T) {
			lib := cudatest.BuildFake(t, dir, strings.Join(tc.defines, "_")+".so", tc.defines...)
			t.Setenv(cuda.EnvLibrary, lib)
			code, out, _ := runCLI(t, "devices", "--json")
			var rep devicesReport
			if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
				t.Fatalf("exit %d, invalid JSON (%v):\n%s", code, err, out)
			}
			if rep.CUDA.Usable || rep.CUDA.Reason != tc.reason || rep.CUDA.Error == "" {
				t.Errorf("cuda = %+v, want reason %s with its error", rep.CUDA, tc.reason)
			}
		})
	}
}

// TestDevicesUsage checks that a stray argument is a usage error.
func TestDevicesUsage(t *testing.T) {
	if code, _, errOut := runCLI(t, "devices", "gpu"); code != 2 || !strings.Contains(errOut, `unexpected argument "gpu"`) {
		t.Errorf("devices gpu: exit %d, stderr %q; want 2 and the stray argument", code, errOut)
	}
}

// needCUDALoader skips a test that loads driver libraries in a binary built
// without the loader.
func needCUDALoader(t *testing.T) {
	t.Helper()
	if !cuda.LoaderBuilt {
		t.Skip("built without the CUDA driver loader (-tags nocuda or an unsupported platform)")
	}
}
