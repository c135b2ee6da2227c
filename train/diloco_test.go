package train

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/model"
)

// fakeInner is an inner learner whose every inner step moves each
// parameter by -move: the pseudo-gradient of H steps is H·move.
type fakeInner struct {
	Learner // unused methods panic
	params  []float32
	move    float32
	opt     []byte      // the optimizer state State returns
	started chan uint64 // if not nil, told each inner step as it starts

	mu    sync.Mutex
	steps []uint64 // inner steps computed
}

func (f *fakeInner) Buckets() []compress.Layout {
	return []compress.Layout{{Shapes: [][]int{{1}}}, {Shapes: [][]int{{len(f.params) - 1}}}}
}
func (f *fakeInner) Params(context.Context) ([]float32, error) { return f.params, nil }
func (f *fakeInner) Step() uint64                              { return 0 }
func (f *fakeInner) Compute(_ context.Context, s uint64, _ Shard, _ func(int, []float32)) (float64, error) {
	f.mu.Lock()
	f.steps = append(f.steps, s)
	f.mu.Unlock()
	if f.started != nil {
		f.started <- s
	}
	return float64(s), nil
}

func (f *fakeInner) Close() error { return nil }

func (f *fakeInner) computed() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprint(f.steps)
}
func (f *fakeInner) Apply(context.Context, uint64) error {
	for i := range f.params {
		f.params[i] -= f.move
	}
	return nil
}
func (f *fakeInner) SetParams(_ context.Context, p []float32) error {
	copy(f.params, p)
	return nil
}
func (f *fakeInner) State(step uint64) (*model.Checkpoint, error) {
	return &model.Checkpoint{Step: int64(step), Params: model.FloatBytes(f.params), Optimizer: append([]byte(nil), f.opt...)}, nil
}
func (f *fakeInner) Restore(_ context.Context, c *model.Checkpoint) error {
	model.BytesToFloats(f.params, c.Params)
	f.opt = append([]byte(nil), c.Optimizer...)
	return nil
}

// outerStep runs one outer step of d whose all-reduce leaves the local
// pseudo-gradient as it is (a ring of one) and returns what was handed over.
func outerStep(t *testing.T, d *DiLoCo, step uint64) []float32 {
	t.Helper()
	var got []float32
	if _, err := d.Compute(context.Background(), step, Shard{Size: 1, Global: 1, Weight: 1}, func(_ int, g []float32) {
		got = append(got, g...)
	}); err != nil {
		t.Fatal(err)
	}
	if err := d.Apply(context.Background(), step); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestDiLoCoOuterStepKnownAnswer: H = 2 inner steps that each move a
// parameter by −0.1 give the pseudo-gradient Δ = 0.2; Nesterov momentum
// μ = 0.9 and η = 0.7 (DiLoCo's defaults) then move the anchor 1 by
// η·(Δ + μ·v) with v = Δ: 0.7·(0.2 + 0.18) = 0.266, to 0.734. The next
// outer step (Δ = 0.2 again, v = 0.9·0.2 + 0.2 = 0.38) moves it by
// 0.7·(0.2 + 0.342) = 0.3794, to 0.3546. The inner learner restarts from
// the anchor each time, and inner steps are numbered s·H + i.
func TestDiLoCoOuterStepKnownAnswer(t *testing.T) {
	f := &fakeInner{params: []float32{1, 1, 1}, move: 0.1}
	d, err := NewDiLoCo(context.Background(), f, DiLoCoConfig{H: 2, LR: 0.7, Momentum: 0.9, Steps: 100})
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range []float64{0.734, 0.3546} {
		delta := outerStep(t, d, uint64(s))
		if len(delta) != 3 || math.Abs(float64(delta[2])-0.2) > 1e-6 {
			t.Fatalf("outer step %d: pseudo-gradient %v, want 0.2 each", s, delta)
		}
		p, _ := d.Params(context.Background())
		for i, v := range p {
			if math.Abs(float64(v)-want) > 1e-6 || f.params[i] != v {
				t.Fatalf("outer step %d: anchor %v (inner %v), want %g", s, p, f.params, want)
			}
		}
	}
	if f.computed() != "[0 1 2 3]" {
		t.Fatalf("inner steps %v, want [0 1 2 3]", f.steps)
	}
}

// TestDiLoCoOverlappedKnownAnswer: with overlap, outer step s+1's inner
// steps start while step s's all-reduce is in flight (here: inside the
// callback that hands step s's buckets over), from anchor − Δ_s; their
// pseudo-gradient is what they moved. With inner moves that do not depend
// on the parameters the anchors are the same as without overlap (0.734,
// then 0.3546: TestDiLoCoOuterStepKnownAnswer).
func TestDiLoCoOverlappedKnownAnswer(t *testing.T) {
	f := &fakeInner{params: []float32{1, 1, 1}, move: 0.1, started: make(chan uint64, 16)}
	d, err := NewDiLoCo(context.Background(), f, DiLoCoConfig{H: 2, LR: 0.7, Momentum: 0.9, Overlap: true, Steps: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sh := Shard{Size: 1, Global: 1, Weight: 1}
	for s, want := range []float64{0.734, 0.3546} {
		var got []float32
		if _, err := d.Compute(context.Background(), uint64(s), sh, func(b int, g []float32) {
			got = append(got, g...)
			if s == 0 && b == 0 {
				// The all-reduce of step 0 is in flight: step 1's first
				// inner step (2) starts without waiting for it.
				for {
					select {
					case i := <-f.started:
						if i != 2 {
							continue
						}
					case <-time.After(10 * time.Second):
						t.Fatal("step 1's inner steps did not start during step 0's all-reduce")
					}
					break
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		if math.Abs(float64(got[0])-0.2) > 1e-6 {
			t.Fatalf("outer step %d: pseudo-gradient %v, want 0.2 each", s, got)
		}
		if err := d.Apply(context.Background(), uint64(s)); err != nil {
			t.Fatal(err)
		}
		p, _ := d.Params(context.Background())
		if math.Abs(float64(p[0])-want) > 1e-6 {
			t.Fatalf("outer step %d: anchor %v, want %g", s, p, want)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if got := f.computed(); got != "[0 1 2 3]" {
		t.Fatalf("inner steps %s, want [0 1 2 3] (none past the run's last outer step)", got)
	}
}

// TestDiLoCoRetryReusesThePseudoGradient: a step retried on the same shard
// (its all-reduce failed) hands over the same pseudo-gradient without
// taking its inner steps again, although the failed all-reduce overwrote
// what was handed; on another shard it starts again from the anchor.
func TestDiLoCoRetryReusesThePseudoGradient(t *testing.T) {
	f := &fakeInner{params: []float32{1, 1}, move: 0.25}
	d, err := NewDiLoCo(context.Background(), f, DiLoCoConfig{H: 2, LR: 0.7, Momentum: 0.9, Steps: 100})
	if err != nil {
		t.Fatal(err)
	}
	sh := Shard{Size: 1, Global: 2, Weight: 1}
	for attempt := range 2 {
		var got []float32
		if _, err := d.Compute(context.Background(), 0, sh, func(_ int, g []float32) {
			got = append(got, g...)
			for i := range g {
				g[i] = 99 // what a half-done all-reduce leaves
			}
		}); err != nil {
			t.Fatal(err)
		}
		if got[0] != 0.5 || got[1] != 0.5 || len(f.steps) != 2 {
			t.Fatalf("attempt %d: pseudo-gradient %v after %d inner steps, want [0.5 0.5] after 2", attempt, got, len(f.steps))
		}
	}
	sh.Offset = 1 // the ring changed
	var got []float32
	if _, err := d.Compute(context.Background(), 0, sh, func(_ int, g []float32) { got = append(got, g...) }); err != nil {
		t.Fatal(err)
	}
	if got[0] != 0.5 || len(f.steps) != 4 {
		t.Fatalf("on a new shard: pseudo-gradient %v after %d inner steps, want 0.5 after 4 (from the anchor again)", got, len(f.steps))
	}
}

// TestDiLoCoStateRoundTrip: a state carries the anchor and the outer
// momentum (and the inner optimizer's state after them); restoring it into
// a fresh DiLoCo gives the same next outer step, and a state without the
// outer momentum is refused with a message saying so.
func TestDiLoCoStateRoundTrip(t *testing.T) {
	f := &fakeInner{params: []float32{1, 2}, move: 0.1, opt: []byte("inner")}
	d, _ := NewDiLoCo(context.Background(), f, DiLoCoConfig{H: 3, LR: 0.7, Momentum: 0.9, Steps: 100})
	outerStep(t, d, 0)
	c, err := d.State(1)
	if err != nil {
		t.Fatal(err)
	}
	g := &fakeInner{params: []float32{0, 0}, move: 0.1}
	e, _ := NewDiLoCo(context.Background(), g, DiLoCoConfig{H: 3, LR: 0.7, Momentum: 0.9, Steps: 100})
	if err := e.Restore(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if string(g.opt) != "inner" {
		t.Fatalf("inner optimizer state %q, want %q", g.opt, "inner")
	}
	outerStep(t, d, 1)
	outerStep(t, e, 1)
	a, _ := d.Params(context.Background())
	b, _ := e.Params(context.Background())
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("after the restored step: %v, want %v", b, a)
	}
	plain := &model.Checkpoint{Params: c.Params, Optimizer: []byte("inner")}
	if err := e.Restore(context.Background(), plain); err == nil || !containsAll(err.Error(), "outer momentum", "sync_every") {
		t.Fatalf("restoring a state without the outer momentum: %v", err)
	}
}

// TestNewDiLoCoRefusesBadSettings: each bad setting names itself.
func TestNewDiLoCoRefusesBadSettings(t *testing.T) {
	for _, tc := range []struct {
		l        Learner
		h        int
		lr, mom  float64
		mentions string
	}{
		{&fakeInner{params: []float32{1, 1}}, 1, 0.7, 0.9, "sync_every"},
		{&fakeInner{params: []float32{1, 1}}, 2, 0, 0.9, "outer_lr"},
		{&fakeInner{params: []float32{1, 1}}, 2, 0.7, 1, "outer_momentum"},
		{struct{ Learner }{}, 2, 0.7, 0.9, "set its parameters"},
	} {
		if _, err := NewDiLoCo(context.Background(), tc.l, DiLoCoConfig{H: tc.h, LR: tc.lr, Momentum: tc.mom}); err == nil || !containsAll(err.Error(), tc.mentions) {
			t.Errorf("H %d lr %g μ %g: error %v, want one naming %s", tc.h, tc.lr, tc.mom, err, tc.mentions)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// TestTrainDiLoCoReplicasAgree: two peers with train.sync_every = 5 (AdamW
// inside; outer momentum 0.5: DiLoCo's 0.9, tuned for H in the hundreds,
// overshoots on this mlp at H = 5) and sint8 pseudo-gradients finish
// train.steps/5 outer steps with one parameter hash, and the loss falls,
// with and without overlap.
func TestTrainDiLoCoReplicasAgree(t *testing.T) {
	requireDataset(t)
	for _, overlap := range []bool{false, true} {
		t.Run(fmt.Sprintf("overlap=%v", overlap), func(t *testing.T) { diLoCoReplicasAgree(t, overlap) })
	}
}

func diLoCoReplicasAgree(t *testing.T, overlap bool) {
	const steps, h = 100, 5
	var peers []*trainPeer
	for range 2 {
		cfg := trainConfig(steps, 2, bootstrapTo(peers)...)
		cfg.Train.SyncEvery = h
		cfg.Train.Optimizer, cfg.Train.LR = "adamw", 0.003
		cfg.Train.OuterMomentum, cfg.Train.OuterOverlap = 0.5, overlap
		cfg.Train.CheckEvery = 2
		cfg.Allreduce.Codec = "sint8"
		peers = append(peers, startTrainer(t, cfg, nil))
	}
	for _, p := range peers {
		p.wait(t, 90*time.Second)
	}
	res := sameResult(t, peers, steps/h)
	pr := peers[0].progress
	first, last := meanLoss(pr[:3]), meanLoss(pr[len(pr)-3:])
	if !(last < 0.8*first) {
		t.Fatalf("training loss did not fall: first outer steps %.3f, last %.3f", first, last)
	}
	t.Logf("DiLoCo H=%d overlap %v, 2 peers, sint8: loss %.3f → %.3f, accuracy %.3f", h, overlap, first, last, res.Accuracy)
}
