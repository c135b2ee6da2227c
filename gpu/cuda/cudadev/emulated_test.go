package cudadev

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/gpu/cuda"
	"github.com/p2ptrain/p2ptrain/gpu/cuda/cudatest"
	"github.com/p2ptrain/p2ptrain/gpu/devicetest"
)

// The tests in this file run the whole CUDA device on a machine without a
// GPU: stand-in libcuda, libcublas and libnvrtc (package cudatest) keep
// "device" memory on the host, and the stand-in NVRTC compiles
// KernelSource with the host C++ compiler, so every kernel, launch
// argument and cuBLAS call of the real path runs through purego. What they
// cannot check is the GPU itself: NVRTC accepting the source, the driver's
// behaviour, parallel execution and device arithmetic (TestConformanceGPU
// does, where there is a GPU).

// fakeEnv builds the stand-in libraries, points the loaders at them and the
// module cache at a temporary directory.
func fakeEnv(t *testing.T, defines ...string) cudatest.FakeGPU {
	t.Helper()
	if !cuda.LoaderBuilt {
		t.Skip("built without the driver loader (-tags nocuda or an unsupported platform)")
	}
	f := cudatest.BuildFakeGPU(t, t.TempDir(), defines...)
	t.Setenv(cuda.EnvLibrary, f.Driver)
	t.Setenv(cuda.EnvBLAS, f.BLAS)
	t.Setenv(cuda.EnvNVRTC, f.NVRTC)
	t.Setenv(cuda.EnvCacheDir, t.TempDir())
	return f
}

// TestEmulatedConformance runs the conformance suite on both stand-in GPUs:
// cuda:0 (compute 8.6, which the stand-in NVRTC knows: a cubin) and cuda:1
// (compute 9.5, which it does not: PTX for compute_90).
func TestEmulatedConformance(t *testing.T) {
	f := fakeEnv(t)
	for i, want := range []string{"--gpu-architecture=sm_86 -fmad=false", "--gpu-architecture=compute_90 -fmad=false"} {
		d, err := Open(i)
		if err != nil {
			t.Fatalf("Open(%d): %v", i, err)
		}
		if got := cudatest.CallString(t, f.NVRTC, "fake_nvrtc_options"); got != want {
			t.Errorf("cuda:%d compiled with %q, want %q", i, got, want)
		}
		t.Run(d.Name(), func(t *testing.T) {
			devicetest.Run(t, func() gpu.Device { return d })
		})
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if n := cudatest.Call(t, f.Driver, "fake_live_allocs"); n != 0 {
		t.Errorf("%d device allocations left after the suite and Close", n)
	}
	if m := cudatest.Call(t, f.BLAS, "fake_blas_math_mode"); m != 0 {
		t.Errorf("cuBLAS math mode %d, want CUBLAS_DEFAULT_MATH (0: fp32, no TF32)", m)
	}
}

// TestEmulatedMatchesCPU checks the kernels that sum in the reference order
// give the CPU device's bits exactly.
func TestEmulatedMatchesCPU(t *testing.T) {
	fakeEnv(t)
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	matchesCPU(t, d)
}

// matchesCPU runs a chain of the kernels whose rounding the reference
// fixes (element-wise, order-fixed sums, pooling, dropout) on d and on the
// CPU device and requires the same bits.
func matchesCPU(t *testing.T, d gpu.Device) {
	t.Helper()
	cs, _ := gpu.NewConvShape(3, 9, 8, 4, 3, 3, 2, 1)
	ps, _ := gpu.NewPoolShape(3, 9, 8, 4, 2, 2)
	x := make([]float32, cs.ColRows()*cs.ColCols())
	for i := range x {
		x[i] = float32(math.Sin(float64(i)*0.37)) * 3
	}
	run := func(dev gpu.Device) []float32 {
		alloc := func(n int) gpu.Buffer {
			b, err := dev.Alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		col, dx, sum := alloc(len(x)), alloc(cs.InLen()), alloc(cs.ColCols())
		y, am, dxp, mask := alloc(ps.OutLen()), alloc(ps.OutLen()), alloc(ps.InLen()), alloc(len(x))
		dev.CopyToDevice(col, x)
		dev.Col2Im(dx, col, cs)
		dev.SumRows(sum, col, cs.ColRows(), cs.ColCols())
		dev.AddBias(col, cs.ColRows(), cs.ColCols(), sum)
		dev.Axpy(0.3, dx, dx)
		dev.MaxPool(y, am, dx, ps)
		dev.ReLU(y, y)
		dev.MaxPoolBackward(dxp, y, am, ps)
		dev.DropoutMask(mask, 0.3, 77)
		dev.Mul(col, col, mask)
		var out []float32
		for _, b := range []gpu.Buffer{dx, sum, col, y, am, dxp} {
			h := make([]float32, b.Len())
			dev.CopyToHost(h, b)
			out = append(out, h...)
			dev.Free(b)
		}
		dev.Free(mask)
		return out
	}
	got, want := run(d), run(gpu.NewCPU(0))
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("element %d: %s %v, CPU %v", i, d.Name(), got[i], want[i])
		}
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// TestEmulatedTrainingMatchesCPU trains both models on one stand-in GPU,
// then on both, against as many CPU devices.
func TestEmulatedTrainingMatchesCPU(t *testing.T) {
	fakeEnv(t)
	var devs []*Device
	for i := range 2 {
		d, err := Open(i)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		devs = append(devs, d)
	}
	trainingMatchesCPU(t, devs)
}

// TestEmulatedDeferredErrors checks that a failed launch is not a panic:
// Synchronize reports it, later work is skipped and CopyToHost gives NaN.
func TestEmulatedDeferredErrors(t *testing.T) {
	f := fakeEnv(t)
	d2, err := Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	x, _ := d2.Alloc(8)
	d2.Fill(x, 2)
	cudatest.Call(t, f.Driver, "fake_set_launch_result", 719)
	d2.Scale(3, x)
	cudatest.Call(t, f.Driver, "fake_set_launch_result", 0)
	d2.Scale(5, x) // skipped: the device has failed
	h := make([]float32, 8)
	d2.CopyToHost(h, x)
	if !math.IsNaN(float64(h[0])) {
		t.Errorf("CopyToHost after a failed launch gave %v, want NaN", h)
	}
	err = d2.Synchronize()
	var re *cuda.ResultError
	if !errors.As(err, &re) || re.Func != "cuLaunchKernel" || !strings.Contains(err.Error(), "gpu: cuda:1: ") {
		t.Fatalf("Synchronize = %v, want the cuLaunchKernel *ResultError", err)
	}
	if _, err := d2.Alloc(1); err == nil {
		t.Error("Alloc on a failed device succeeded")
	}
}

// TestEmulatedOpenErrors checks gpu.OpenAll through the registered opener:
// "cuda" opens every GPU, and a missing cuBLAS or NVRTC symbol, or an
// index the driver lacks, is ErrUnavailable wrapping the loader's error.
func TestEmulatedOpenErrors(t *testing.T) {
	fakeEnv(t)
	devs, err := gpu.OpenAll([]string{"cuda", "cpu"})
	if err != nil || len(devs) != 3 || devs[0].Name() != "cuda:0" || devs[1].Name() != "cuda:1" || devs[2].Name() != "cpu:0" {
		t.Fatalf("OpenAll(cuda, cpu) = %v, %v", devs, err)
	}
	for _, d := range devs[:2] {
		d.(*Device).Close()
	}
	if _, err := gpu.Open("cuda:2"); !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), "no such GPU") {
		t.Errorf("Open(cuda:2) = %v", err)
	}
	if _, err := gpu.OpenAll([]string{"cuda:1", "cuda"}); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Errorf("OpenAll(cuda:1, cuda) = %v, want a duplicate", err)
	}

	for omit, sym := range map[string]string{"cublasSgemm_v2": "cublasSgemm_v2", "nvrtcGetPTX": "nvrtcGetPTXSize"} {
		t.Run(sym, func(t *testing.T) {
			fakeEnv(t, "OMIT_"+omit)
			_, err := gpu.Open("cuda:0")
			var sm *cuda.SymbolMissingError
			if !errors.As(err, &sm) || sm.Symbol != sym || !errors.Is(err, gpu.ErrUnavailable) || !errors.Is(err, cuda.ErrNoGPU) {
				t.Fatalf("Open = %v, want ErrUnavailable wrapping a *SymbolMissingError for %s", err, sym)
			}
		})
	}
	t.Run("no cuBLAS", func(t *testing.T) {
		fakeEnv(t)
		t.Setenv(cuda.EnvBLAS, filepath.Join(t.TempDir(), "libcublas.so.12"))
		_, err := gpu.Open("cuda")
		var nf *cuda.LibraryNotFoundError
		if !errors.As(err, &nf) || nf.Name != "libcublas.so.12" {
			t.Fatalf("Open = %v, want a *LibraryNotFoundError for libcublas", err)
		}
	})
}

// TestEmulatedModuleCache checks the compiled kernels are cached on disk and
// reused, and that an entry the driver refuses is compiled afresh.
func TestEmulatedModuleCache(t *testing.T) {
	f := fakeEnv(t)
	dir := os.Getenv(cuda.EnvCacheDir)
	compiles := func() int { return cudatest.Call(t, f.NVRTC, "fake_nvrtc_compiles") }
	open := func() {
		t.Helper()
		clear(images) // forget the in-memory copy: read the disk
		d, err := Open(0)
		if err != nil {
			t.Fatal(err)
		}
		x, _ := d.Alloc(3)
		d.Fill(x, 1)
		d.Scale(2, x)
		h := make([]float32, 3)
		d.CopyToHost(h, x)
		if h[2] != 2 {
			t.Errorf("kernel result %v", h)
		}
		d.Free(x)
		d.Close()
	}
	open()
	entries, _ := filepath.Glob(filepath.Join(dir, "sm_86-*.bin"))
	if compiles() != 1 || len(entries) != 1 {
		t.Fatalf("first open: %d compiles, cache entries %v", compiles(), entries)
	}
	open()
	if compiles() != 1 {
		t.Errorf("second open compiled again (%d compiles)", compiles())
	}
	// A well-formed entry holding an image the driver refuses.
	cuda.ModuleCache{Dir: dir}.Put(strings.TrimSuffix(filepath.Base(entries[0]), ".bin"), []byte("not a module"))
	open()
	if compiles() != 2 {
		t.Errorf("a refused cache entry was not recompiled (%d compiles)", compiles())
	}
	open()
	if compiles() != 2 {
		t.Errorf("the recompiled entry was not cached (%d compiles)", compiles())
	}
}

// TestEmulatedBadInputs runs badInputs on the stand-in GPUs.
func TestEmulatedBadInputs(t *testing.T) {
	fakeEnv(t)
	badInputs(t, func(k int) *Device {
		d, err := Open(k % 2)
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}

// badInputs checks that a label that is not a class index, and a token that
// is not an index into the embedding table (in the forward pass and in the
// backward pass), give NaN where they were used and an error from
// Synchronize, rather than a read or write outside the buffers. open returns
// a fresh device for each of the three cases (a device that reported such
// an error has failed); badInputs closes it.
func badInputs(t *testing.T, open func(k int) *Device) {
	t.Helper()
	// tokens allocates a 3-row table, two tokens (the second, 2.5, is not
	// an index) and their 2×2 output.
	tokens := func(d *Device) (table, ids, y gpu.Buffer) {
		table, ids, y = alloc(t, d, 6), alloc(t, d, 2), alloc(t, d, 6)
		d.CopyToDevice(ids, []float32{1, 2.5})
		return table, ids, y
	}
	cases := []struct {
		name, want string
		run        func(d *Device) []gpu.Buffer
	}{
		{"label", "label is not a class index", func(d *Device) []gpu.Buffer {
			p, l, lab := alloc(t, d, 4), alloc(t, d, 2), alloc(t, d, 2)
			d.CopyToDevice(lab, []float32{1, 7})
			d.SoftmaxCrossEntropy(p, l, p, lab, 2, 2)
			loss := make([]float32, 2)
			d.CopyToHost(loss, l)
			if !math.IsNaN(float64(loss[1])) || math.IsNaN(float64(loss[0])) {
				t.Errorf("losses %v, want a NaN for the bad label only", loss)
			}
			return []gpu.Buffer{p, l, lab}
		}},
		{"token forward", "token is not an index", func(d *Device) []gpu.Buffer {
			table, ids, y := tokens(d)
			d.Embedding(y, table, ids, 2, 2, 3)
			rows := make([]float32, 6)
			d.CopyToHost(rows, y)
			if !math.IsNaN(float64(rows[3])) || math.IsNaN(float64(rows[0])) {
				t.Errorf("embedding rows %v, want NaN for the bad token only", rows)
			}
			return []gpu.Buffer{table, ids, y}
		}},
		{"token backward", "token is not an index", func(d *Device) []gpu.Buffer {
			table, ids, y := tokens(d)
			d.EmbeddingBackward(table, ids, y, 2, 2, 3)
			return []gpu.Buffer{table, ids, y}
		}},
	}
	for k, c := range cases {
		d := open(k)
		bufs := c.run(d)
		if err := d.Synchronize(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Synchronize after a bad %s = %v, want an error containing %q", d.Name(), c.name, err, c.want)
		}
		for _, b := range bufs {
			d.Free(b)
		}
		if err := d.Close(); err != nil {
			t.Errorf("%s: Close after a bad %s: %v", d.Name(), c.name, err)
		}
	}
}

func alloc(t *testing.T, d gpu.Device, n int) gpu.Buffer {
	t.Helper()
	b, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
