package train

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/p2ptrain/p2ptrain/node/nodetest"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

// TestCheckCheckpointDir: the check before a run creates a missing
// directory, refuses one it cannot create or write and a regular file,
// and a latest checkpoint past the run's last step (outer step with
// DiLoCo), naming train.checkpoint_dir, the file, its step and the run's.
func TestCheckCheckpointDir(t *testing.T) {
	cfg := func(dir string, steps, syncEvery int) config.Train {
		return config.Train{CheckpointDir: dir, Steps: steps, SyncEvery: syncEvery}
	}
	if err := CheckCheckpointDir(cfg("", 3, 1)); err != nil {
		t.Fatalf("no checkpoint_dir: %v", err)
	}
	fresh := filepath.Join(t.TempDir(), "a", "b")
	if err := CheckCheckpointDir(cfg(fresh, 3, 1)); err != nil {
		t.Fatalf("missing directory: %v", err)
	}
	if st, err := os.Stat(fresh); err != nil || !st.IsDir() {
		t.Fatalf("the missing directory was not created: %v", err)
	}
	if ents, _ := os.ReadDir(fresh); len(ents) != 0 {
		t.Fatalf("the check left %d files behind", len(ents))
	}
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	dir := t.TempDir()
	if _, err := model.WriteCheckpoint(dir, &model.Checkpoint{Step: 6, Params: make([]byte, 8)}, 0); err != nil {
		t.Fatal(err)
	}
	huge := t.TempDir()
	if _, err := model.WriteCheckpoint(huge, &model.Checkpoint{Step: 1e15, Params: make([]byte, 8)}, 0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  config.Train
		want []string // "": no error
	}{
		{"a regular file", cfg(file, 3, 1), []string{"train.checkpoint_dir: " + file + " is not a directory"}},
		{"under a regular file", cfg(filepath.Join(file, "ck"), 3, 1), []string{"train.checkpoint_dir: ", filepath.Join(file, "ck") + ": not a directory"}},
		{"past the run", cfg(dir, 3, 1), []string{"train.checkpoint_dir: " + model.CheckpointPath(dir, 6) + " is at step 6, beyond train.steps (3)"}},
		{"far past the run", cfg(huge, 3, 1), []string{"is at step 1000000000000000, beyond train.steps (3)"}},
		{"the run's end", cfg(dir, 6, 1), nil},
		{"an earlier step", cfg(dir, 7, 1), nil},
		{"past DiLoCo's outer steps", cfg(dir, 50, 10), []string{"is at outer step 6, beyond the run's 5 outer steps (train.steps 50 / train.sync_every 10)"}},
		{"DiLoCo's last outer step", cfg(dir, 60, 10), nil},
	} {
		err := CheckCheckpointDir(tc.cfg)
		if (err == nil) != (tc.want == nil) {
			t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", tc.name, err, w)
			}
		}
	}
	if _, err := os.Stat("/proc/self"); err == nil {
		if err := CheckCheckpointDir(cfg("/proc/qa_ck", 3, 1)); err == nil || !strings.Contains(err.Error(), "train.checkpoint_dir: cannot create it: mkdir /proc/qa_ck") {
			t.Errorf("/proc/qa_ck: %v", err)
		}
	}
}

// epochCounter counts the new ring epochs a trainer asks for.
type epochCounter struct {
	*node.Node
	requests atomic.Int64
}

func (c *epochCounter) RequestEpoch(current uint64) {
	c.requests.Add(1)
	c.Node.RequestEpoch(current)
}

// checkpointedRun trains steps steps alone with train.checkpoint_dir dir
// and returns the result.
func checkpointedRun(t *testing.T, dir string, steps int) Result {
	t.Helper()
	cfg := trainConfig(steps, 1)
	cfg.Train.CheckpointDir = dir
	p := startTrainer(t, cfg, nil)
	p.wait(t, time.Minute)
	if p.err != nil || p.res.Step != uint64(steps) {
		t.Fatalf("run of %d steps: %+v, %v", steps, p.res, p.err)
	}
	return p.res
}

// TestTrainRefusesCheckpointBeyondSteps: a trainer whose checkpoint is
// past train.steps stops at once with an error naming the file, its step
// and train.steps. (It once took the final state for a majority that was
// behind and looped for good, asking for a new ring epoch each time.)
func TestTrainRefusesCheckpointBeyondSteps(t *testing.T) {
	requireDataset(t)
	dir := t.TempDir()
	checkpointedRun(t, dir, 6)
	cfg := trainConfig(3, 1)
	cfg.Train.CheckpointDir = dir
	var c *epochCounter
	p := startTrainerWrapped(t, cfg, nil, nil, func(n *node.Node) Cluster {
		c = &epochCounter{Node: n}
		return c
	})
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("still running after 5 s, having asked for %d new ring epochs", c.requests.Load())
	}
	want := model.CheckpointPath(dir, 6) + " is at step 6, beyond train.steps (3)"
	if p.err == nil || !strings.Contains(p.err.Error(), want) {
		t.Fatalf("error %v, want one with %q", p.err, want)
	}
	if len(p.progress) != 0 {
		t.Fatalf("trained %d steps", len(p.progress))
	}
}

// TestTrainResumesAFinishedRun: a run started again on the checkpoint of
// its last step (train.steps) trains nothing and reports the same result,
// resumed at that step (an event says so), writing no checkpoint again.
func TestTrainResumesAFinishedRun(t *testing.T) {
	requireDataset(t)
	dir := t.TempDir()
	first := checkpointedRun(t, dir, 6)
	cfg := trainConfig(6, 1)
	cfg.Train.CheckpointDir = dir
	p := startTrainer(t, cfg, nil)
	p.wait(t, 30*time.Second)
	if p.err != nil || p.res.Step != 6 || p.res.ParamHash != first.ParamHash || p.res.Resumed != 6 || p.res.Trained != 0 ||
		first.Resumed != 0 || first.Trained != 6 {
		t.Fatalf("finished run started again: %+v, %v; the first ended %+v", p.res, p.err, first)
	}
	recs, _ := p.timeline.Since(0)
	resumed, written := 0, 0
	for _, r := range recs {
		switch r.Event {
		case telemetry.EventResumed:
			resumed++
			if r.Step != 6 || !strings.HasSuffix(r.Message, ".p2pt") {
				t.Errorf("resumed event %+v: want step 6 and the checkpoint's file", r)
			}
		case telemetry.EventCheckpoint:
			written++
		}
	}
	if resumed != 1 || written != 0 {
		t.Errorf("%d resumed events and %d checkpoints written, want 1 and 0 (the file it resumed from holds step 6)", resumed, written)
	}
	if len(p.progress) != 0 {
		t.Fatalf("trained %d more steps", len(p.progress))
	}
}

// TestTrainFailsWhenTheFinalCheckpointFails: a run whose final checkpoint
// cannot be written does not end as a success: Run returns its result
// with an error that names the step and why.
func TestTrainFailsWhenTheFinalCheckpointFails(t *testing.T) {
	requireDataset(t)
	const steps = 4
	dir := filepath.Join(t.TempDir(), "ck")
	cfg := trainConfig(steps, 1)
	cfg.Train.CheckpointDir = dir
	p := startTrainer(t, cfg, func(_ *trainPeer, pr Progress) {
		if pr.Step == steps {
			// The directory turns into a file after the last step.
			if err := os.RemoveAll(dir); err != nil {
				t.Error(err)
			}
			if err := os.WriteFile(dir, nil, 0o644); err != nil {
				t.Error(err)
			}
		}
	})
	p.wait(t, time.Minute)
	if p.err == nil || errors.Is(p.err, context.Canceled) {
		t.Fatalf("run ended with %v, want a failed final checkpoint", p.err)
	}
	for _, w := range []string{"final checkpoint", "step 4", dir} {
		if !strings.Contains(p.err.Error(), w) {
			t.Errorf("error %q lacks %q", p.err, w)
		}
	}
	if p.res.Step != steps {
		t.Errorf("result at step %d, want %d", p.res.Step, steps)
	}
}

// TestTrainWaitsForANewEpochAfterAFailedRejoin: a finished peer that
// takes an epoch whose majority is behind it for another go, and cannot
// enter it, waits for a newer epoch rather than taking the same one again
// at once. Here its own state is past train.steps (resume refuses such a
// checkpoint now; this peer is given the state directly), so every epoch
// looks behind and no member holds what it chooses: it once re-entered
// its epoch in a loop, as fast as it could evaluate.
func TestTrainWaitsForANewEpochAfterAFailedRejoin(t *testing.T) {
	requireDataset(t)
	dir := t.TempDir()
	checkpointedRun(t, dir, 6)
	ck, err := model.LoadLatestCheckpoint(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := trainConfig(3, 1)
	n, err := node.New(context.Background(), cfg, nodetest.Logger(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Kill() })
	c := &epochCounter{Node: n}
	history := telemetry.NewHistory(1 << 14)
	tr, err := New(c, cfg.Train, cfg.Allreduce, Options{Log: nodetest.Logger(t, cfg), Train: fashion.train, Test: fashion.test,
		Linger: time.Minute, Telemetry: history})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithCancel(context.Background())
	if err := tr.restore(ctx, ck); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a ring epoch", func() error {
		if _, ep := n.View(); len(ep.Order) == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.Run(ctx)
	}()
	time.Sleep(3 * time.Second)
	cancel()
	<-done
	_, ep := n.View()
	records, _ := history.Since(0)
	evals := 0
	for _, r := range records {
		if r.Kind == telemetry.KindEval {
			evals++
		}
	}
	requests := c.requests.Load()
	t.Logf("in 3 s: %d final evaluations, %d new ring epochs asked for, %d adopted", evals, requests, ep.Number)
	if requests > int64(ep.Number)+1 {
		t.Fatalf("asked for %d new ring epochs in 3 s with %d adopted: it re-entered epochs it had given up", requests, ep.Number)
	}
}
