package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu/cuda"
	"github.com/p2ptrain/p2ptrain/gpu/cuda/cudatest"
)

// benchTrainJSON runs `bench train` with args and --json and decodes it.
func benchTrainJSON(t *testing.T, args ...string) []trainBenchResult {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(context.Background(), append([]string{"bench", "train", "--json"}, args...), &out, &errOut); code != 0 {
		t.Fatalf("bench train %s: exit %d\n%s", strings.Join(args, " "), code, errOut.String())
	}
	var rs []trainBenchResult
	if err := json.Unmarshal(out.Bytes(), &rs); err != nil {
		t.Fatalf("decoding %s: %v", out.String(), err)
	}
	return rs
}

// TestBenchTrainCPU checks one row per device set, with the devices opened,
// the samples counted over every device, and finite losses.
func TestBenchTrainCPU(t *testing.T) {
	rs := benchTrainJSON(t, "--devices", "cpu", "--devices", "cpu:0,cpu:1", "--model", "mlp",
		"--batch-size", "16", "--steps", "2", "--warmup", "1", "--data", "synthetic")
	if len(rs) != 2 {
		t.Fatalf("%d results, want 2", len(rs))
	}
	for i, want := range [][]string{{"cpu:0"}, {"cpu:0", "cpu:1"}} {
		r := rs[i]
		if strings.Join(r.Devices, ",") != strings.Join(want, ",") || r.Model != "mlp" || r.BatchPerDevice != 16 ||
			r.Steps != 2 || r.Data != "synthetic" {
			t.Errorf("result %d = %+v", i, r)
		}
		if !(r.SamplesPerS > 0) || math.Abs(r.SamplesPerS*r.StepMS/1e3-float64(16*len(want))) > 1e-6*r.SamplesPerS {
			t.Errorf("result %d: %v samples/s and %v ms a step do not give %d samples a step", i, r.SamplesPerS, r.StepMS, 16*len(want))
		}
		if math.IsNaN(r.FirstLoss) || math.IsNaN(r.LastLoss) || r.FirstLoss <= 0 {
			t.Errorf("result %d: losses %v → %v", i, r.FirstLoss, r.LastLoss)
		}
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"bench", "train", "--batch-size", "8", "--steps", "1", "--data", "synthetic"}, &out, &out); code != 0 ||
		!strings.Contains(out.String(), "SAMPLES/S") || !strings.Contains(out.String(), "cpu:0") {
		t.Errorf("table output (exit %d):\n%s", code, out.String())
	}
}

// TestBenchTrainGPT checks that the gpt trains on text windows (random
// bytes here), not on images: its loss starts near ln 256, a uniform guess
// over the byte vocabulary.
func TestBenchTrainGPT(t *testing.T) {
	rs := benchTrainJSON(t, "--model", "gpt", "--batch-size", "2", "--steps", "1", "--warmup", "0", "--data", "synthetic")
	if len(rs) != 1 || rs[0].Model != "gpt" || rs[0].Data != "synthetic" {
		t.Fatalf("results %+v", rs)
	}
	if l := rs[0].FirstLoss; math.Abs(l-math.Log(256)) > 1 {
		t.Errorf("first loss %v, want near ln 256 = %.3f", l, math.Log(256))
	}
}

// TestBenchTrainErrors checks flag and device errors.
func TestBenchTrainErrors(t *testing.T) {
	t.Setenv(cuda.EnvLibrary, t.TempDir()) // no driver there
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--steps", "0"}, 2, "must be positive"},
		{[]string{"--data", "mnist", "--steps", "1"}, 2, `--data "mnist"`},
		{[]string{"--model", "resnet", "--steps", "1", "--data", "synthetic"}, 2, `--model: "resnet" is not one of cnn, gpt, mlp`},
		{[]string{"--model", "gpt", "--steps", "1", "--data", "fashion"}, 2, "gpt trains on text"},
		{[]string{"--devices", "tpu", "--steps", "1"}, 2, `--devices tpu: gpu: bad device spec: "tpu": unknown kind`},
		{[]string{"--devices", "cuda", "--steps", "1"}, 2, `"cuda": no usable GPU: `}, // libcuda not found, or no loader (nocuda)
	} {
		var out bytes.Buffer
		code := run(context.Background(), append([]string{"bench", "train"}, tc.args...), &out, &out)
		if code != tc.code || !strings.Contains(out.String(), tc.want) {
			t.Errorf("bench train %s: exit %d, output %q; want exit %d with %q", strings.Join(tc.args, " "), code, out.String(), tc.code, tc.want)
		}
	}
}

// TestBenchTrainEmulatedCUDA trains on the stand-in GPUs (package
// cudatest: the CUDA device's real code path, kernels run on the host) and
// checks the losses follow the CPU's: the same data, seed and model give the
// same first loss up to GEMM rounding.
func TestBenchTrainEmulatedCUDA(t *testing.T) {
	if !cuda.LoaderBuilt {
		t.Skip("built without the driver loader")
	}
	f := cudatest.BuildFakeGPU(t, t.TempDir())
	t.Setenv(cuda.EnvLibrary, f.Driver)
	t.Setenv(cuda.EnvBLAS, f.BLAS)
	t.Setenv(cuda.EnvNVRTC, f.NVRTC)
	t.Setenv(cuda.EnvCacheDir, t.TempDir())
	args := []string{"--model", "cnn", "--batch-size", "4", "--steps", "2", "--warmup", "0", "--data", "synthetic"}
	rs := benchTrainJSON(t, append(args, "--devices", "cpu:0,cpu:1", "--devices", "cuda")...)
	if len(rs) != 2 || strings.Join(rs[1].Devices, ",") != "cuda:0,cuda:1" {
		t.Fatalf("results %+v", rs)
	}
	c, g := rs[0], rs[1]
	t.Logf("cpu:0,cpu:1 loss %v → %v; emulated cuda:0,cuda:1 %v → %v", c.FirstLoss, c.LastLoss, g.FirstLoss, g.LastLoss)
	if math.Abs(c.FirstLoss-g.FirstLoss) > 1e-4 || math.Abs(c.LastLoss-g.LastLoss) > 1e-3 {
		t.Errorf("CPU losses %v → %v, emulated CUDA %v → %v", c.FirstLoss, c.LastLoss, g.FirstLoss, g.LastLoss)
	}
}
