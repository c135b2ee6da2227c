package cudadev

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/gpu/cuda"
	"github.com/p2ptrain/p2ptrain/gpu/devicetest"
	"github.com/p2ptrain/p2ptrain/model"
)

// The tests in this file need a real GPU. They run wherever cuda.Enumerate
// finds one, and skip only when its error matches cuda.ErrNoGPU, saying
// why; with P2PTRAIN_REQUIRE_GPU=1 they fail instead of skipping.

// realGPUs returns the machine's GPUs (see above), with the module cache in
// a temporary directory so NVRTC compiles afresh.
func realGPUs(t *testing.T) []cuda.DeviceInfo {
	t.Helper()
	infos, err := cuda.Enumerate()
	if errors.Is(err, cuda.ErrNoGPU) {
		if os.Getenv("P2PTRAIN_REQUIRE_GPU") == "1" {
			t.Fatalf("P2PTRAIN_REQUIRE_GPU=1 but no usable GPU: %v", err)
		}
		t.Skipf("no usable GPU on this machine (GPU-only test): %v", err)
	}
	if err != nil {
		t.Fatalf("cuda.Enumerate: %v", err)
	}
	t.Setenv(cuda.EnvCacheDir, t.TempDir())
	return infos
}

// openReal opens every GPU, closing them when the test ends.
func openReal(t *testing.T) []*Device {
	t.Helper()
	var devs []*Device
	for _, info := range realGPUs(t) {
		d, err := Open(info.Index)
		if err != nil {
			t.Fatalf("Open(%d) (%s): %v", info.Index, info.Name, err)
		}
		t.Cleanup(func() { d.Close() })
		t.Logf("%s: %s, compute %s, cuBLAS %d", d.Name(), info.Name, info.ComputeCapability(), d.blas.Version())
		devs = append(devs, d)
	}
	return devs
}

// TestConformanceGPU runs the conformance suite on every GPU.
func TestConformanceGPU(t *testing.T) {
	for _, d := range openReal(t) {
		t.Run(d.Name(), func(t *testing.T) {
			devicetest.Run(t, func() gpu.Device { return d })
		})
	}
}

// TestGPUMatchesCPU checks that the kernels whose summation order the
// reference fixes give the CPU device's bits on every GPU.
func TestGPUMatchesCPU(t *testing.T) {
	for _, d := range openReal(t) {
		t.Run(d.Name(), func(t *testing.T) { matchesCPU(t, d) })
	}
}

// TestGPUTrainingMatchesCPU runs a few training steps of both models on one
// GPU, then on every GPU together (each taking a share of the batch), and
// compares losses and parameters with the same run on as many CPU devices:
// equal up to GEMM rounding, and the replicas identical.
func TestGPUTrainingMatchesCPU(t *testing.T) { trainingMatchesCPU(t, openReal(t)) }

// TestGPUBadInputs runs badInputs on the first GPU, opened afresh for each
// case: a bad label or token is reported by Synchronize, not read or written
// out of range, and the device closes cleanly after it.
func TestGPUBadInputs(t *testing.T) {
	infos := realGPUs(t)
	badInputs(t, func(int) *Device {
		d, err := Open(infos[0].Index)
		if err != nil {
			t.Fatalf("Open(%d): %v", infos[0].Index, err)
		}
		return d
	})
}

// trainingMatchesCPU is TestGPUTrainingMatchesCPU on the devices all.
func trainingMatchesCPU(t *testing.T, all []*Device) {
	sets := [][]*Device{all[:1]}
	if len(all) > 1 {
		sets = append(sets, all)
	}
	for _, name := range []string{"mlp", "cnn", "gpt"} {
		for _, set := range sets {
			var gdevs, cdevs []gpu.Device
			for i, d := range set {
				gdevs = append(gdevs, d)
				cdevs = append(cdevs, gpu.NewCPU(i))
			}
			gl, gp := trainSteps(t, name, gdevs)
			cl, cp := trainSteps(t, name, cdevs)
			t.Logf("%s on %d GPU(s): losses %v, CPU %v", name, len(set), gl, cl)
			for i := range gl {
				if math.Abs(gl[i]-cl[i]) > 1e-3*max(1, math.Abs(cl[i])) {
					t.Errorf("%s on %d GPU(s): step %d loss %v, CPU %v", name, len(set), i, gl[i], cl[i])
				}
			}
			var worst float64
			for i := range gp {
				worst = max(worst, math.Abs(float64(gp[i]-cp[i])))
			}
			if worst > 1e-3 {
				t.Errorf("%s on %d GPU(s): parameters differ from the CPU run's by up to %v", name, len(set), worst)
			}
		}
	}
}

// trainSteps runs 4 plain SGD steps (a small rate, so the runs stay calm
// and rounding differences do not grow) of model name on devs (8 samples per device)
// and returns the losses and the final parameters, after checking every
// replica holds them.
func trainSteps(t *testing.T, name string, devs []gpu.Device) ([]float64, []float32) {
	t.Helper()
	const batch = 8
	// gpt at a tiny size: 2 blocks of width 16, 2 heads, 8 tokens of 32.
	gpt := model.GPTConfig{Layers: 2, DModel: 16, Heads: 2, Context: 8, Vocab: 32}
	m, err := model.New(name, model.Config{MaxBatch: batch, GPT: gpt}, devs, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	opt, err := model.NewOptimizer(model.OptimConfig{Name: "sgd", LR: 0.01, Momentum: -1}, m)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var losses []float64
	for step := range 4 {
		batches := make([]model.Batch, len(devs))
		for i := range batches {
			per := 1
			for _, d := range m.InputShape() {
				per *= d
			}
			b := model.Batch{X: make([]float32, batch*per), Y: make([]uint8, batch*m.LabelsPerSample())}
			for j := range b.X {
				if name == "gpt" { // token IDs
					b.X[j] = float32(rng.IntN(m.Classes()))
				} else {
					b.X[j] = float32(rng.NormFloat64())
				}
			}
			for j := range b.Y {
				b.Y[j] = uint8(rng.IntN(m.Classes()))
			}
			batches[i] = b
		}
		st, err := m.ComputeGradients(batches, model.NoiseSeed(3, int64(step), 0), nil)
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, st.Loss)
		m.ApplyGradients(opt, int64(step))
	}
	if err := m.CheckReplicas(); err != nil {
		t.Errorf("replicas after training: %v", err)
	}
	for _, d := range devs {
		if err := d.Synchronize(); err != nil {
			t.Errorf("%s: %v", d.Name(), err)
		}
	}
	return losses, append([]float32(nil), m.Params()...)
}
