package train

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/model"
)

// CheckCheckpointDir checks train.checkpoint_dir before a run of cfg
// starts (nothing when it is not set), as the Trainer does when it
// resumes: the directory must be one this process can write checkpoints
// into (it is created when missing, as the first checkpoint would create
// it), and its latest checkpoint, which the run resumes, must not be
// past the run's last step (train.steps, or train.steps/train.sync_every
// outer steps with DiLoCo). Only the latest checkpoint's header is read.
// Every error names train.checkpoint_dir.
func CheckCheckpointDir(cfg config.Train) error {
	if cfg.CheckpointDir == "" {
		return nil
	}
	steps := cfg.Steps
	if cfg.SyncEvery > 1 {
		steps /= cfg.SyncEvery
	}
	_, err := latestWithin(cfg.CheckpointDir, steps, cfg.SyncEvery)
	return err
}

// latestWithin checks train.checkpoint_dir dir (checkpointDirWritable)
// and returns the path of its latest checkpoint ("" when it has none),
// refusing one past steps (outer steps when syncEvery > 1; see
// checkpointWithin). Every error names train.checkpoint_dir.
func latestWithin(dir string, steps, syncEvery int) (string, error) {
	if err := checkpointDirWritable(dir); err != nil {
		return "", fmt.Errorf("train.checkpoint_dir: %w", err)
	}
	path, step, err := model.LatestCheckpoint(dir)
	switch {
	case errors.Is(err, model.ErrNoCheckpoint):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("train.checkpoint_dir: %w", err)
	}
	if err := checkpointWithin(path, step, steps, syncEvery); err != nil {
		return "", fmt.Errorf("train.checkpoint_dir: %w", err)
	}
	return path, nil
}

// checkpointDirWritable creates dir when it does not exist and checks that
// it is a directory a checkpoint's temporary file can be created in
// (WriteCheckpoint's first write).
func checkpointDirWritable(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case err == nil && !st.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("cannot create it: %w", err)
		}
	case err != nil:
		return err
	}
	f, err := os.CreateTemp(dir, ".ckpt-*.tmp")
	if err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// checkpointWithin refuses the checkpoint at path holding step completed
// steps for a run of steps steps (outer steps when syncEvery > 1): resuming
// past the run's end has nothing to train, and its state is a step no
// other member of the run can hold.
func checkpointWithin(path string, step int64, steps, syncEvery int) error {
	if step <= int64(steps) {
		return nil
	}
	if syncEvery > 1 {
		return fmt.Errorf("%s is at outer step %d, beyond the run's %d outer steps (train.steps %d / train.sync_every %d): raise train.steps to go on from it, or use another directory",
			path, step, steps, steps*syncEvery, syncEvery)
	}
	return fmt.Errorf("%s is at step %d, beyond train.steps (%d): raise train.steps to go on from it, or use another directory", path, step, steps)
}
