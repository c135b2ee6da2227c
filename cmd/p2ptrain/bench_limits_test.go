package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/model"
)

// withMachineMemory makes the memory estimates see avail bytes available
// of total for the rest of the test.
func withMachineMemory(t *testing.T, avail, total float64) {
	t.Helper()
	old := machineMemory
	machineMemory = func() (float64, float64, bool) { return avail, total, true }
	t.Cleanup(func() { machineMemory = old })
}

// TestBenchLimits checks that sizes the configuration refuses for the
// same quantities (train.batch_size, train.model, train.devices,
// node.max_peers) are usage errors naming the flag, the value and the
// config key, before anything is allocated; and that each of bench
// train's flags is named on its own.
func TestBenchLimits(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"bench", "train", "--model", "gpt", "--batch-size", "99999"},
			[]string{"bench train: --batch-size: 99999 is above 4096 (as config key train.batch_size)"}},
		{[]string{"bench", "train", "--batch-size", "4097", "--steps", "1", "--warmup", "0", "--data", "synthetic"},
			[]string{"--batch-size: 4097 is above 4096"}},
		{[]string{"bench", "train", "--batch-size", "0"}, []string{"--batch-size: 0 must be at least 1"}},
		{[]string{"bench", "train", "--steps", "0"}, []string{"bench train: --steps must be positive, got 0"}},
		{[]string{"bench", "train", "--warmup", "-1"}, []string{"bench train: --warmup must not be negative, got -1"}},
		{[]string{"bench", "train", "--model", "bogus"}, []string{`bench train: --model: "bogus" is not one of cnn, gpt, mlp (as config key train.model)`}},
		{[]string{"bench", "train", "--devices", "bogus"}, []string{`bench train: --devices bogus: gpu: bad device spec: "bogus": unknown kind "bogus"`}},
		{[]string{"bench", "train", "--devices", "cpu", "--devices", "cpu,"}, []string{"--devices cpu,: gpu: bad device spec: empty spec", "train.devices[1]"}},
		{[]string{"bench", "allreduce", "--inproc", "--peers", "100000"}, []string{"bench allreduce: --peers: 100000 is outside 1..1024 (as config key node.max_peers)"}},
		{[]string{"bench", "allreduce", "--inproc", "--peers", "1025", "--size", "4"}, []string{"--peers: 1025 is outside 1..1024"}},
		{[]string{"bench", "allreduce", "--expect", "1025"}, []string{"--expect: 1025 is outside 1..1024"}},
	} {
		runWantingUsageError(t, tc.args, tc.want...)
	}
}

// runWantingUsageError runs the CLI with args and checks that it exits 2
// with nothing on stdout and every string of want in its stderr.
func runWantingUsageError(t *testing.T, args []string, want ...string) {
	t.Helper()
	code, stdout, stderr := runCLI(t, args...)
	if stdout != "" {
		t.Errorf("%s: stdout %q, want nothing", strings.Join(args, " "), stdout)
	}
	wantUsageError(t, code, stderr, want)
}

// TestBenchMemoryEstimates checks that runs within the flags' limits that
// would not fit in the machine's memory (1 GiB available here) are refused
// up front, exit 2, naming the flags, the estimate and the memory, where
// they used to crash the process with "fatal error: runtime: out of
// memory".
func TestBenchMemoryEstimates(t *testing.T) {
	withMachineMemory(t, 1<<30, 2<<30)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"bench", "train", "--model", "gpt", "--batch-size", "4096", "--devices", "cpu", "--devices", "cpu:0,cpu:1"},
			[]string{"bench train: --model gpt --batch-size 4096 --devices cpu would need about 76.", "GiB of memory for the model's parameters",
				"this machine has 1.0 GiB available (2.0 GiB in all): lower --batch-size"}},
		{[]string{"bench", "codecs", "--size", "1Gi"},
			[]string{"bench codecs: --size 1Gi would need about 40.4 GiB of memory", "1.0 GiB available", "lower --size"}},
		{[]string{"bench", "allreduce", "--inproc", "--peers", "1024", "--size", "4KiB"},
			[]string{"bench allreduce: --inproc --peers 1024 --size 4KiB would need about 6.", "GiB of memory", "lower --size or --peers"}},
		{[]string{"bench", "allreduce", "--inproc", "--peers", "8", "--size", "1GiB", "--codec", "powersgd"},
			[]string{"--inproc --peers 8 --size 1GiB would need about 96.4 GiB"}},
		{[]string{"bench", "allreduce", "--expect", "2", "--size", "1GiB"}, []string{"bench allreduce: --size 1GiB would need about 8.4 GiB"}},
	} {
		runWantingUsageError(t, tc.args, tc.want...)
	}
	// What fits runs.
	if code, _, stderr := runCLI(t, "bench", "train", "--batch-size", "8", "--steps", "1", "--warmup", "0", "--data", "synthetic"); code != 0 {
		t.Errorf("a small bench train: exit %d, %s", code, stderr)
	}
}

// TestModelBytesMatchesMeasurements checks the model memory estimate
// against the peak resident memory of runs it was fitted to (the
// process's, from /usr/bin/time): never below, and besides baseBytes (the
// process and a dataset) at most 1.5 times the measurement.
func TestModelBytesMatchesMeasurements(t *testing.T) {
	for _, tc := range []struct {
		what     string
		name     string
		cfg      model.Config
		batch    int
		measured float64 // bytes
	}{
		{"bench train --model gpt --batch-size 64", "gpt", model.Config{}, 64, 1352244 << 10},
		{"bench train --model gpt --batch-size 16", "gpt", model.Config{}, 16, 414828 << 10},
		{"bench train --model cnn --batch-size 1024", "cnn", model.Config{}, 1024, 1029132 << 10},
		{"bench train --model mlp --batch-size 4096", "mlp", model.Config{}, 4096, 245612 << 10},
		{"bench train --model mlp --batch-size 2 --data fashion", "mlp", model.Config{}, 2, 373024 << 10},
		{"plan --gpt-context 1024 (time batch 4)", "gpt", model.Config{GPT: gptPresets["small"]}, 4, 1167168 << 10},
		{"plan --preset large (time batch 4)", "gpt", model.Config{GPT: gptPresets["large"]}, 4, 2544872 << 10},
	} {
		cfg := tc.cfg
		if strings.Contains(tc.what, "context 1024") {
			cfg.GPT.Context = 1024
		}
		est, _, err := modelBytes(tc.name, cfg, tc.batch, 1)
		if err != nil {
			t.Fatal(err)
		}
		if est+baseBytes < tc.measured || est > 1.5*tc.measured {
			t.Errorf("%s: estimate %s + %s, measured %s", tc.what, formatBytes(est), formatBytes(baseBytes), formatBytes(tc.measured))
		}
	}
	// GPUs hold their replicas: only the host's copies count.
	cpu, _, _ := modelBytes("gpt", model.Config{}, 64, 1)
	gpu, _, _ := modelBytes("gpt", model.Config{}, 64, 0)
	if !(gpu > 0 && gpu < cpu/10) {
		t.Errorf("gpt at 64 samples: %s with a CPU device, %s with a GPU", formatBytes(cpu), formatBytes(gpu))
	}
}

// TestMachineMemory checks the reading of this machine's memory.
func TestMachineMemory(t *testing.T) {
	avail, total, ok := machineMemory()
	if !ok {
		t.Skip("no /proc/meminfo")
	}
	if !(avail > 0 && avail <= total) {
		t.Errorf("available %v, total %v", avail, total)
	}
	if got := formatBytes(1.5 * (1 << 30)); got != "1.5 GiB" {
		t.Errorf("formatBytes(1.5 GiB) = %q", got)
	}
}

// TestCgroupMemoryLeavesOutThePageCache: in a container, memory the
// kernel can reclaim (inactive file pages) is not counted as used.
func TestCgroupMemoryLeavesOutThePageCache(t *testing.T) {
	dir := t.TempDir()
	old := cgroupDir
	cgroupDir = dir
	t.Cleanup(func() { cgroupDir = old })
	for name, body := range map[string]string{
		"memory.max":     "1073741824\n", // 1 GiB, below any machine's
		"memory.current": "1000000000\n", // almost all of it, mostly cache
		"memory.stat":    "anon 150000000\nfile 850000000\ninactive_file 800000000\nactive_file 50000000\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	avail, total, ok := machineMemory()
	if !ok {
		t.Skip("no /proc/meminfo")
	}
	if total != 1073741824 || avail < 0.8e9 {
		t.Fatalf("avail %s of %s: want the inactive page cache counted as available", formatBytes(avail), formatBytes(total))
	}
}
