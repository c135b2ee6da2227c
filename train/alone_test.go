package train

import (
	"math"
	"sync/atomic"
	"testing"
	"time"
)

// TestTrainAloneNonFiniteGradient: a peer training in a ring of one, which
// checks each step's gradient once (before the all-reduce, not again
// after it), still contributes zeros for a local NaN or -Inf instead of
// applying it: every step is computed once and counted once, and the
// parameters stay finite (a NaN applied would stop the run).
func TestTrainAloneNonFiniteGradient(t *testing.T) {
	requireDataset(t)
	const steps = 10
	var computed [steps]atomic.Int32
	hook := func(step uint64, bucket int, g []float32) {
		if bucket == 0 {
			computed[step].Add(1)
		}
		switch step {
		case 3:
			g[0] = float32(math.NaN())
		case 6:
			g[len(g)-1] = float32(math.Inf(-1))
		}
	}
	p := startTrainerHook(t, trainConfig(steps, 1), nil, hook)
	p.wait(t, time.Minute)
	if p.err != nil {
		t.Fatalf("run stopped: %v", p.err)
	}
	if p.res.Step != steps {
		t.Fatalf("ended at step %d, want %d", p.res.Step, steps)
	}
	for s := range computed {
		if n := computed[s].Load(); n != 1 {
			t.Errorf("step %d computed %d times, want once", s, n)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	counted := map[uint64]int{}
	for _, pr := range p.progress {
		counted[pr.Step]++
	}
	for s := uint64(1); s <= steps; s++ {
		if counted[s] != 1 {
			t.Errorf("step %d completed %d times, want once", s, counted[s])
		}
	}
}
