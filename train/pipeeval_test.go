package train

import (
	"math"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

// evalRecords returns p's eval records by step.
func evalRecords(t *testing.T, p *trainPeer) map[uint64]telemetry.Record {
	t.Helper()
	recs, _ := p.timeline.Since(0)
	out := map[uint64]telemetry.Record{}
	for _, r := range recs {
		if r.Kind != telemetry.KindEval {
			continue
		}
		if _, dup := out[r.Step]; dup || r.TestLoss == nil || r.BitsPerByte == nil {
			t.Fatalf("peer %s: eval record %+v: a second one for its step, or figures missing", p.n.ID(), r)
		}
		out[r.Step] = r
	}
	return out
}

// pipeEvalBound is the largest relative difference accepted between the
// held-out loss of 2×2 pipelines and of data parallelism after the same
// steps on the same global batches. Their parameters differ by fp32
// summation order amplified by AdamW (every tensor within 1e-3 relative
// L2, observed 2e-5), which moves the loss by far less (observed 4e-10);
// a chunk of the held-out set lost or counted twice moves it by about
// 1/16 (the 64 windows in chunks of 4).
const pipeEvalBound = 1e-5

// checkPipelineEval checks the evaluations of a run of 2×2 pipelines (pp)
// and of data parallelism (dp) after steps (the last one the final
// evaluation): every pipelined peer has an eval record at each of them
// with the same test loss and bits per byte bit for bit (the two
// pipelines evaluate the same held-out set with the same parameters:
// replicas of a stage are identical, and the evaluation is
// deterministic), its final line reports those figures, they are within
// pipeEvalBound of data parallelism's, and equal to the bit to the whole
// model's Evaluate on the stages' parameters (first and last: the stages'
// tensors by whole-model name), in the same chunks.
func checkPipelineEval(t *testing.T, dp, pp []*trainPeer, steps []uint64, first, last map[string][]float32) {
	t.Helper()
	final := steps[len(steps)-1]
	ref := evalRecords(t, pp[0])
	for _, p := range pp {
		recs := evalRecords(t, p)
		for _, s := range steps {
			r, ok := recs[s]
			if !ok {
				t.Fatalf("peer %s has no eval record at step %d (records at %v)", p.n.ID(), s, recs)
			}
			if math.Float64bits(*r.TestLoss) != math.Float64bits(*ref[s].TestLoss) || math.Float64bits(*r.BitsPerByte) != math.Float64bits(*ref[s].BitsPerByte) {
				t.Fatalf("step %d: peer %s reports test loss %v (%v bits per byte), peer %s %v (%v)", s, p.n.ID(), *r.TestLoss, *r.BitsPerByte,
					pp[0].n.ID(), *ref[s].TestLoss, *ref[s].BitsPerByte)
			}
		}
		if len(recs) != len(steps) {
			t.Errorf("peer %s has eval records at %d steps, want %v", p.n.ID(), len(recs), steps)
		}
		if p.res.Accuracy < 0 || p.res.Loss != *ref[final].TestLoss || p.res.BitsPerByte != *ref[final].BitsPerByte || p.res.Accuracy != pp[0].res.Accuracy {
			t.Fatalf("peer %s's final line %q, want the final evaluation's test loss %v", p.n.ID(), p.res, *ref[final].TestLoss)
		}
	}
	dref := evalRecords(t, dp[0])
	for _, s := range steps {
		d := math.Abs(*ref[s].TestLoss-*dref[s].TestLoss) / *dref[s].TestLoss
		t.Logf("step %d: held-out loss %.6f (%.4f bits per byte) through the pipelines, %.6f by data parallelism: relative %.2g",
			s, *ref[s].TestLoss, *ref[s].BitsPerByte, *dref[s].TestLoss, d)
		if d > pipeEvalBound {
			t.Fatalf("step %d: held-out loss %v through the pipelines, %v by data parallelism (relative %.2g > %g)", s, *ref[s].TestLoss, *dref[s].TestLoss, d, pipeEvalBound)
		}
	}
	// The whole model on the stages' parameters.
	pl := stagePeer(t, pp[0])
	whole, err := model.New(pl.cfg.Model, pl.mcfg, []gpu.Device{gpu.NewCPU(0)}, pl.cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	for name, v := range tensorsByName(whole) {
		src := first[name]
		if src == nil {
			src = last[name]
		}
		if len(src) != len(v) {
			t.Fatalf("tensor %s: %d values in the stages, %d in the whole model", name, len(src), len(v))
		}
		copy(v, src)
	}
	whole.SyncReplicas()
	st, err := whole.Evaluate(pl.test)
	if err != nil {
		t.Fatal(err)
	}
	if st.Loss != pp[0].res.Loss || st.Accuracy() != pp[0].res.Accuracy {
		t.Fatalf("the whole model on the stages' parameters: loss %v, accuracy %v; the pipelines reported %v and %v", st.Loss, st.Accuracy(), pp[0].res.Loss, pp[0].res.Accuracy)
	}
}
