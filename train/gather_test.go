package train

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/model"
)

// TestJoinedStagesRecutIntoAnotherCut: what a re-plan from a pipeline into
// another pipeline does to the state. The stages of a 2-stage cut of a
// whole gpt state, joined (PipeLearner.joinStates), give the whole state
// byte for byte, and each stage of a 3-stage cut taken from the joined
// state holds the parameters that cut takes from the original.
func TestJoinedStagesRecutIntoAnotherCut(t *testing.T) {
	cfg := gptConfig(10, 1, 4).Train
	whole, err := NewModelLearner(cfg, 1<<20, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	params := make([]byte, 4*whole.NumParams())
	for i := 0; i < len(params); i += 4 {
		binary.LittleEndian.PutUint32(params[i:], math.Float32bits(float32(rng.NormFloat64())))
	}
	if err := whole.Model().SetParamBytes(params); err != nil {
		t.Fatal(err)
	}
	orig, err := whole.State(7)
	if err != nil {
		t.Fatal(err)
	}
	pipe := func(split []int) *PipeLearner {
		t.Helper()
		c := cfg
		c.PipelineStages = config.Stages(len(split) - 1)
		pl, err := NewPipeLearner(c, 1<<20, nil, nil)
		if err == nil {
			err = pl.useSplit(split)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pl.Close() })
		return pl
	}
	old := pipe([]int{0, 2, 5})
	var cps []*model.Checkpoint
	for s := range 2 {
		if err := old.SetStageFrom(s, whole.Model(), orig); err != nil {
			t.Fatal(err)
		}
		c, err := old.State(7)
		if err != nil {
			t.Fatal(err)
		}
		cps = append(cps, c)
	}
	fresh, err := NewModelLearner(cfg, 1<<20, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	joined, err := old.joinStates(fresh.Model(), cps)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(joined.Params, orig.Params) || !slices.Equal(joined.Optimizer, orig.Optimizer) || joined.Step != 7 {
		t.Fatal("the joined stages differ from the whole state they were cut from")
	}
	if err := fresh.Restore(t.Context(), joined); err != nil {
		t.Fatal(err)
	}
	next, ref := pipe([]int{0, 1, 3, 5}), pipe([]int{0, 1, 3, 5})
	for s := range 3 {
		if err := next.SetStageFrom(s, fresh.Model(), joined); err != nil {
			t.Fatal(err)
		}
		if err := ref.SetStageFrom(s, whole.Model(), orig); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(next.Model().Params(), ref.Model().Params()) {
			t.Errorf("stage %d of the new cut, from the joined state, differs from the same stage cut from the original", s)
		}
	}
	if _, err := old.joinStates(fresh.Model(), cps[:1]); err == nil {
		t.Error("joining one state into 2 stages: no error")
	}
}
