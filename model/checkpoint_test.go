package model

import (
	"errors"
	"os"
	"testing"
)

// TestLatestCheckpoint: the latest checkpoint's path and the step its
// header holds, without reading the rest; none in an empty or missing
// directory; a file that is not a checkpoint is ErrBadCheckpoint.
func TestLatestCheckpoint(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := LatestCheckpoint(dir); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty directory: %v", err)
	}
	if _, _, err := LatestCheckpoint(dir + "/absent"); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("missing directory: %v", err)
	}
	for _, s := range []int64{6, 1e15} {
		if _, err := WriteCheckpoint(dir, &Checkpoint{Step: s, Params: make([]byte, 8)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if p, s, err := LatestCheckpoint(dir); err != nil || p != CheckpointPath(dir, 1e15) || s != 1e15 {
		t.Fatalf("got %s at step %d, %v", p, s, err)
	}
	os.WriteFile(CheckpointPath(dir, 2e15), []byte("not a checkpoint"), 0o644)
	if _, _, err := LatestCheckpoint(dir); !errors.Is(err, ErrBadCheckpoint) {
		t.Fatalf("a file that is not a checkpoint: %v", err)
	}
}
