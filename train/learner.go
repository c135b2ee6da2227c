package train

import (
	"context"
	"errors"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/model"
)

// Learner is the model side of a Trainer: it computes this peer's gradients
// for a step, applies the averaged ones, and hands over and takes back the
// training state. The Trainer owns everything in between: ring epochs, the
// all-reduce, retries, parameter-hash checks and state sync. The built-in
// models are one Learner (NewModelLearner); package bridge makes a training
// process outside the daemon (a PyTorch script) another.
//
// The Trainer calls every method from its training goroutine except State,
// which the state server calls concurrently with Compute (never with Apply
// or Restore: the Trainer excludes them).
type Learner interface {
	// Buckets returns each fusion bucket's layout (its tensors' shapes), in
	// the order Compute hands the buckets over.
	Buckets() []compress.Layout
	// NumParams returns the number of parameters (float32 values).
	NumParams() int
	// Devices names the local devices; each computes train.batch_size
	// samples of the global batch per step.
	Devices() []string
	// Settings returns what the learner computes that must agree across the
	// cluster and between a checkpoint and the run resuming it (the model,
	// its optimizer, its data), by key.
	Settings() Settings
	// Step returns the number of steps the learner's state had completed
	// when it was made (a process that loaded its own checkpoint).
	Step() uint64
	// MaxStateBytes bounds the size of a state (State's checkpoint,
	// marshalled) that a peer may send this learner.
	MaxStateBytes() uint64
	// Compute computes the local gradients of step on this peer's shard of
	// the global batch. It calls ready(b, g) for every bucket b in order, as
	// soon as its gradient g is complete; g stays this learner's until the
	// next Compute or Restore, and the Trainer may scale it and has the
	// all-reduce replace it with the average, which Apply then applies.
	// The all-reduce writes g in place: after a failed attempt g holds a
	// mix of values, and the Trainer calls Compute again for the retry, so
	// each call must hand over a gradient computed (or copied) anew.
	// It returns the local training loss.
	Compute(ctx context.Context, step uint64, sh Shard, ready func(b int, g []float32)) (loss float64, err error)
	// Apply applies the averaged gradients (what the all-reduce wrote into
	// the buckets of the last Compute) as step: afterwards the learner has
	// completed step+1 steps.
	Apply(ctx context.Context, step uint64) error
	// Params returns the current parameters in bucket order (valid until the
	// next Compute, Apply or Restore; the caller must not change them).
	Params(ctx context.Context) ([]float32, error)
	// State returns the training state after step completed steps (its
	// ConfigHash is the Trainer's to set), or an error wrapping
	// ErrStateUnavailable when the learner holds another step.
	State(step uint64) (*model.Checkpoint, error)
	// Restore replaces the training state with c (its size, step and
	// configuration are checked by the Trainer).
	Restore(ctx context.Context, c *model.Checkpoint) error
	// Evaluate measures the model on held-out data, or returns
	// ErrNoEvaluation.
	Evaluate() (model.Stats, error)
	// Close releases the learner's resources.
	Close() error
}

// ErrNoEvaluation: the learner has no held-out data of its own (an external
// training process evaluates itself).
var ErrNoEvaluation = errors.New("train: the learner does not evaluate")

// ErrLearner marks a learner failure that retrying cannot cure (its
// process exited, its device failed): the run stops with it.
var ErrLearner = errors.New("train: the learner failed")

// ErrStateUnavailable: the learner does not hold the state asked for.
var ErrStateUnavailable = errors.New("train: no state at that step")

// Shard is one peer's part of each step's global batch in a ring epoch.
// Peers may have different numbers of devices, each device taking
// train.batch_size samples, so their parts differ in size.
type Shard struct {
	// Offset and Size place this peer's samples at positions
	// [Offset, Offset+Size) of the global batch of Global samples.
	Offset, Size, Global int
	// FirstDevice is the global index of this peer's first device batch
	// (the random layers' seed).
	FirstDevice int
	// Weight scales this peer's local mean gradient before the ring
	// averages the members' gradients with equal weights, so that the
	// result is the mean over the global batch: Size·world/Global (exactly 1
	// when every member has as many samples).
	Weight float32
}
