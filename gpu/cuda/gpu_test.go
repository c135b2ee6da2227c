package cuda

import (
	"errors"
	"os"
	"testing"
)

// realDriver returns the machine's CUDA driver and its devices, or skips the
// test when no GPU is usable (saying why); with P2PTRAIN_REQUIRE_GPU=1 it
// fails instead. Where a GPU is present the tests that call it run.
func realDriver(t *testing.T) (*Driver, []DeviceInfo) {
	t.Helper()
	noGPU := func(err error) {
		if os.Getenv("P2PTRAIN_REQUIRE_GPU") == "1" {
			t.Fatalf("P2PTRAIN_REQUIRE_GPU=1 but no usable GPU: %v", err)
		}
		t.Skipf("no usable GPU on this machine (GPU-only test): %v", err)
	}
	d, err := Load()
	if err != nil {
		noGPU(err)
	}
	devs, err := d.Devices()
	var nd *NoDeviceError
	if errors.As(err, &nd) {
		noGPU(err)
	}
	if err != nil {
		t.Fatalf("driver %s loads but Devices fails: %v", d.Path(), err)
	}
	return d, devs
}

// TestRealGPU checks what the real driver reports: plausible names, memory
// and compute capabilities, in ordinal order.
func TestRealGPU(t *testing.T) {
	d, devs := realDriver(t)
	t.Logf("driver %s, version %s", d.Path(), FormatVersion(d.Version()))
	if d.Version() < MinDriverVersion {
		t.Errorf("Version() = %d, below MinDriverVersion although Load accepted it", d.Version())
	}
	for i, info := range devs {
		t.Logf("%s: %s, %.1f GiB, compute %s, %d SMs", info.Spec(), info.Name,
			float64(info.TotalMemory)/(1<<30), info.ComputeCapability(), info.Multiprocessors)
		switch {
		case info.Index != i:
			t.Errorf("device %d has Index %d", i, info.Index)
		case info.Name == "":
			t.Errorf("%s has no name", info.Spec())
		case info.TotalMemory < 1<<28:
			t.Errorf("%s reports %d bytes of memory", info.Spec(), info.TotalMemory)
		case info.ComputeMajor < 3 || info.ComputeMinor < 0:
			t.Errorf("%s reports compute capability %s", info.Spec(), info.ComputeCapability())
		case info.Multiprocessors <= 0:
			t.Errorf("%s reports %d multiprocessors", info.Spec(), info.Multiprocessors)
		case info.DriverVersion != d.Version():
			t.Errorf("%s has driver version %d, want %d", info.Spec(), info.DriverVersion, d.Version())
		}
	}
	again, err := Enumerate()
	if err != nil || len(again) != len(devs) {
		t.Errorf("second Enumerate() = %d devices, %v; want %d", len(again), err, len(devs))
	}
}
