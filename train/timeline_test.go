package train

import (
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/telemetry"
)

// TestTrainTimelineRecordsEveryStepEvaluationAndCheckpoint checks the
// telemetry a run produces: one step record per step with its time split,
// an evaluation record per evaluation, and an event per checkpoint.
func TestTrainTimelineRecordsEveryStepEvaluationAndCheckpoint(t *testing.T) {
	requireDataset(t)
	const steps = 20
	var peers []*trainPeer
	for range 2 {
		cfg := trainConfig(steps, 2, bootstrapTo(peers)...)
		cfg.Train.EvalEvery = 10
		cfg.Train.CheckpointDir = filepath.Join(t.TempDir(), "ckpt")
		cfg.Train.CheckpointEvery = 10
		peers = append(peers, startTrainer(t, cfg, nil))
	}
	for _, p := range peers {
		p.wait(t, 60*time.Second)
	}
	sameResult(t, peers, steps)
	recs, _ := peers[0].timeline.Since(0)
	var stepsSeen []uint64
	evals, checkpoints := 0, 0
	for _, r := range recs {
		switch {
		case r.Kind == telemetry.KindStep:
			stepsSeen = append(stepsSeen, r.Step)
			if r.Steps != steps || r.Peers != 2 || r.Codec == "" || r.BytesSent <= 0 || r.SamplesPerS <= 0 {
				t.Errorf("step record %+v lacks figures", r)
			}
			if r.ComputeS < 0 || r.AllreduceS < 0 || r.WaitS < 0 || math.Abs(r.ComputeS+r.AllreduceS-r.StepS) > 1e-9 {
				t.Errorf("step %d: compute %.6f s + all-reduce %.6f s is not the step's %.6f s (wait %.6f s)", r.Step, r.ComputeS, r.AllreduceS, r.StepS, r.WaitS)
			}
		case r.Kind == telemetry.KindEval:
			evals++
			if r.Accuracy == nil || r.TestLoss == nil || *r.Accuracy <= 0 || r.BitsPerByte != nil || r.EvalS <= 0 {
				t.Errorf("evaluation record %+v: want test loss, accuracy and its time, no bits per byte", r)
			}
		case r.Event == telemetry.EventCheckpoint:
			checkpoints++
			if r.Message == "" {
				t.Errorf("checkpoint event %+v names no file", r)
			}
		}
	}
	if len(stepsSeen) != steps {
		t.Fatalf("%d step records, want %d: %v", len(stepsSeen), steps, stepsSeen)
	}
	for i, s := range stepsSeen {
		if s != uint64(i+1) {
			t.Fatalf("step records out of order: %v", stepsSeen)
		}
	}
	// Evaluations at step 10 and the final one; checkpoints at 10 and 20,
	// which is the final step's (not written twice).
	if evals != 2 || checkpoints != 2 {
		t.Errorf("%d evaluation records and %d checkpoint events, want 2 and 2", evals, checkpoints)
	}
}
