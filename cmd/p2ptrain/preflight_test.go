package main

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/model"
)

// writeIDXGz writes a gzip-compressed unsigned-byte IDX file of dims
// (zero data) as dir/name.gz.
func writeIDXGz(t *testing.T, dir, name string, dims ...int) {
	t.Helper()
	b := []byte{0, 0, 0x08, byte(len(dims))}
	n := 1
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, uint32(d))
		n *= d
	}
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(append(b, make([]byte, n)...))
	w.Close()
	if err := os.WriteFile(filepath.Join(dir, name+".gz"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPreflightCheckpointDirAndImages: a train.checkpoint_dir that cannot
// hold checkpoints, or whose latest checkpoint is past train.steps, and
// images of a shape the model does not take exit 2 before the peer
// starts, naming the key, the file and what is wrong. (They once started
// a run that failed its checkpoints and exited 0, looped for good, or
// retried every step for good.)
func TestPreflightCheckpointDirAndImages(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	os.Mkdir(small, 0o755)
	writeIDXGz(t, small, "train-images-idx3-ubyte", 10, 2, 2)
	writeIDXGz(t, small, "train-labels-idx1-ubyte", 10)
	writeIDXGz(t, small, "t10k-images-idx3-ubyte", 5, 2, 2)
	writeIDXGz(t, small, "t10k-labels-idx1-ubyte", 5)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	ckpt := filepath.Join(dir, "ckpt")
	if _, err := model.WriteCheckpoint(ckpt, &model.Checkpoint{Step: 6, Params: make([]byte, 8)}, 0); err != nil {
		t.Fatal(err)
	}
	// The external trainer needs no dataset: only the checkpoint
	// directory is checked.
	external := append(slices.Clone(loopback), "--steps", "3", "--trainer", "external")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"checkpoint past train.steps", append(slices.Clone(external), "--set", "train.checkpoint_dir="+ckpt),
			[]string{"train.checkpoint_dir: " + model.CheckpointPath(ckpt, 6) + " is at step 6, beyond train.steps (3)"}},
		{"checkpoint_dir a file", append(slices.Clone(external), "--set", "train.checkpoint_dir="+file),
			[]string{"train.checkpoint_dir: " + file + " is not a directory"}},
		{"checkpoint_dir under a file", append(slices.Clone(external), "--set", "train.checkpoint_dir="+filepath.Join(file, "ck")),
			[]string{"train.checkpoint_dir: ", filepath.Join(file, "ck") + ": not a directory"}},
		{"images the mlp does not take", append(slices.Clone(loopback), "--steps", "3", "--set", "train.data_dir="+small),
			[]string{"train.data_dir: " + filepath.Join(small, "train-images-idx3-ubyte.gz") + ": images are 2×2, mlp needs 28×28",
				filepath.Join(small, "t10k-images-idx3-ubyte.gz") + ": images are 2×2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runJoin(t, tc.args...)
			wantUsageError(t, code, stderr, tc.want)
			if strings.Contains(stdout, "dial this peer at:") {
				t.Errorf("the peer announced itself:\n%s", stdout)
			}
		})
	}
	// A checkpoint at train.steps (a finished run) passes.
	if _, err := resolveArgs(t, append(slices.Clone(external), "--steps", "6", "--set", "train.checkpoint_dir="+ckpt)...); err != nil {
		t.Errorf("checkpoint at train.steps: %v", err)
	}
}

// TestPreflightRefusesAModelBeyondMemory: a data-parallel model whose
// estimate exceeds the memory available is refused naming
// train.batch_size; the defaults of every model, and the shipped gpt
// example, fit in 4 GiB; a pipelined model is left to its stages.
func TestPreflightRefusesAModelBeyondMemory(t *testing.T) {
	withMachineMemory(t, 4<<30, 8<<30)
	for _, name := range model.Names() {
		c := config.DefaultConfig().Train
		c.Model = name
		if err := checkModelMemory(c); err != nil {
			t.Errorf("%s's defaults: %v", name, err)
		}
	}
	small, err := loadConfig("../../examples/gpt-small.toml")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkModelMemory(small.Train); err != nil {
		t.Errorf("examples/gpt-small.toml: %v", err)
	}
	big := config.DefaultConfig().Train
	big.Model, big.BatchSize, big.GPT.Context = "gpt", 4096, 16384
	err = checkModelMemory(big)
	if err == nil || !strings.Contains(err.Error(), "train.batch_size: ") || !strings.Contains(err.Error(), "context 16384 would need about") {
		t.Fatalf("a gpt of context 16384, batch 4096: %v", err)
	}
	big.PipelineStages = 2
	if err := checkModelMemory(big); err != nil {
		t.Errorf("2 pipeline stages: %v", err)
	}
}
