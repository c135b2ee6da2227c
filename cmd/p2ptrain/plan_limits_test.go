package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlanLimits checks that plan's sizes are bounded as the configuration
// bounds the same quantities ([train.gpt], train.model, node.max_peers,
// train.batch_size for --time-batch) and that --model and --device are
// checked before anything runs: usage errors (exit 2) naming the flag,
// where they used to panic (makeslice), run out of memory, hang, or exit 1.
func TestPlanLimits(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--gpt-d-model", "99999999", "--gpt-heads", "1"}, []string{"plan: --gpt-d-model: 99999999 must be in [1, 16384] (as config key train.gpt.d_model)"}},
		{[]string{"--gpt-d-model", "100000", "--gpt-heads", "1"}, []string{"--gpt-d-model: 100000 must be in [1, 16384]"}},
		{[]string{"--gpt-context", "99999999"}, []string{"plan: --gpt-context: 99999999 must be in [2, 16384] (as config key train.gpt.context)"}},
		{[]string{"--gpt-layers", "99999999"}, []string{"plan: --gpt-layers: 99999999 must be in [1, 256]"}},
		{[]string{"--gpt-layers", "0"}, []string{"plan: --gpt-layers: 0 must be in [1, 256]"}}, // was taken as "the preset's"
		{[]string{"--gpt-vocab", "257"}, []string{"--gpt-vocab: 257 must be in [2, 256]"}},
		{[]string{"--preset", "tiny", "--peers", "2147483647"}, []string{"plan: --peers: 2147483647 is outside 1..1024 (as config key node.max_peers)"}},
		{[]string{"--model", "bogus"}, []string{`plan: --model: "bogus" is not one of cnn, gpt, mlp (as config key train.model)`}},
		{[]string{"--device", "bogus"}, []string{`plan: --device: gpu: bad device spec: "bogus": unknown kind "bogus"`}},
		{[]string{"--gpt-heads", "3"}, []string{"plan: --gpt-d-model: 256 is not a multiple of --gpt-heads (3)", "the value is --preset small's"}},
		{[]string{"--time-batch", "5000"}, []string{"plan: --time-batch: 5000 is above 4096 (as config key train.batch_size)"}},
		{[]string{"--batch", "0"}, []string{"plan: --batch must be positive, got 0"}},
		{[]string{"--micro", "0"}, []string{"plan: --micro must be positive, got 0"}},
		{[]string{"--reps", "0"}, []string{"plan: --reps must be positive, got 0"}},
		{[]string{"--time-batch", "-1"}, []string{"plan: --time-batch must not be negative, got -1"}},
		{[]string{"--top", "-1"}, []string{"plan: --top must not be negative, got -1"}},
	} {
		runWantingUsageError(t, append([]string{"plan"}, tc.args...), tc.want...)
	}
}

// TestPlanMemoryEstimate checks that a model within [train.gpt]'s ranges
// that would not fit in memory is refused before it is built, naming the
// flags, the estimate and the machine's memory; that the estimate counts
// the timing batch; and that --layer-times, which builds no model, is not
// refused.
func TestPlanMemoryEstimate(t *testing.T) {
	// About 16 TiB: no machine has it, whatever this one's memory.
	code, _, stderr := runCLI(t, "plan", "--gpt-layers", "256", "--gpt-d-model", "16384", "--gpt-heads", "1")
	if code != 2 || !strings.Contains(stderr, "plan: --preset small --gpt-layers 256 --gpt-d-model 16384 --gpt-heads 1 (825G parameters, context 128) "+
		"timed on 4 samples (--time-batch) on --device cpu would need about 1") || !strings.Contains(stderr, "TiB of memory for the model's parameters") ||
		!strings.Contains(stderr, "this machine has ") {
		t.Errorf("a 16 TiB gpt: exit %d, %q", code, stderr)
	}

	lt := filepath.Join(t.TempDir(), "tiny.json")
	code, out, stderr := runCLI(t, "plan", "--preset", "tiny", "--reps", "1", "--cpu-costs=false", "--json")
	if code != 0 {
		t.Fatalf("plan --json: exit %d, %s", code, stderr)
	}
	if err := os.WriteFile(lt, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	withMachineMemory(t, 768<<20, 1<<30)
	code, _, stderr = runCLI(t, "plan", "--preset", "tiny", "--gpt-context", "2048", "--time-batch", "4", "--reps", "1")
	if code != 2 || !strings.Contains(stderr, "plan: --preset tiny --gpt-context 2048 (") ||
		!strings.Contains(stderr, "timed on 4 samples (--time-batch) on --device cpu would need about 1.0 GiB") ||
		!strings.Contains(stderr, "this machine has 768.0 MiB available (1.0 GiB in all): choose a smaller model or time fewer samples (--time-batch)") {
		t.Errorf("context 2048 in 768 MiB: exit %d, %q", code, stderr)
	}
	// One sample fits.
	if code, _, stderr := runCLI(t, "plan", "--preset", "tiny", "--gpt-context", "2048", "--time-batch", "1", "--reps", "1", "--cpu-costs=false", "--top", "1"); code != 0 {
		t.Errorf("context 2048, one sample, in 768 MiB: exit %d, %s", code, stderr)
	}
	withMachineMemory(t, 1, 1)
	if code, _, stderr := runCLI(t, "plan", "--preset", "tiny", "--layer-times", lt, "--cpu-costs=false"); code != 0 {
		t.Errorf("--layer-times with no memory: exit %d, %s", code, stderr)
	}
}
