package model

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestCutStateMatchesWholeModel trains the tiny gpt whole for 3 AdamW
// steps, cuts its state into the stages of two splits, and checks that
// each stage restores its cut and holds every tensor's parameters and
// both optimizer moments as the whole model does, the head's copy of the
// token table the table's.
func TestCutStateMatchesWholeModel(t *testing.T) {
	whole := newGPT(t, tinyGPT, 2, 1, 7)
	cfg := OptimConfig{Name: "adamw", LR: 0.01, WeightDecay: 0.1}
	opt, err := NewOptimizer(cfg, whole)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for step := range int64(3) {
		if _, err := whole.ComputeGradients([]Batch{randomTokens(rng, tinyGPT, 2)}, 0, nil); err != nil {
			t.Fatal(err)
		}
		whole.ApplyGradients(opt, step)
	}
	c := whole.Checkpoint(opt, 3, ConfigHash("cut"))
	_, n, moments, err := parseOptState(c.Optimizer)
	if err != nil || n != whole.NumParams() || len(moments) != 2 {
		t.Fatalf("the whole optimizer's state: %d parameters, %d moments, %v", n, len(moments), err)
	}
	want := [3]map[string][]float32{byName(whole, whole.Params()), byName(whole, moments[0]), byName(whole, moments[1])}
	for _, split := range [][]int{{0, 2, 5}, {0, 1, 3, 4, 5}} {
		for s := range len(split) - 1 {
			st := newStage(t, "gpt", Config{GPT: tinyGPT, MaxBatch: 2}, split[s], split[s+1])
			cut, err := CutState(whole, st, c)
			if err != nil {
				t.Fatal(err)
			}
			sopt, err := NewOptimizer(cfg, st)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Restore(cut, sopt); err != nil {
				t.Fatalf("stage [%d, %d) restoring its cut: %v", split[s], split[s+1], err)
			}
			_, _, sm, err := parseOptState(sopt.State())
			if err != nil || len(sm) != 2 {
				t.Fatalf("stage [%d, %d): %d moments, %v", split[s], split[s+1], len(sm), err)
			}
			for k, got := range [3]map[string][]float32{byName(st, st.Params()), byName(st, sm[0]), byName(st, sm[1])} {
				for name, v := range got {
					if w := want[k][wholeName(name)]; !slices.Equal(v, w) {
						t.Errorf("stage [%d, %d) %s: vector %d differs from the whole model's", split[s], split[s+1], name, k)
					}
				}
			}
		}
	}
	st := newStage(t, "gpt", Config{GPT: tinyGPT, MaxBatch: 2}, 0, 2)
	if _, err := CutState(st, st, c); err == nil {
		t.Error("a cut from a stage: no error")
	}
	bad := *c
	bad.Params = bad.Params[:8]
	if _, err := CutState(whole, st, &bad); !errors.Is(err, ErrBadState) {
		t.Errorf("a short state: %v, want ErrBadState", err)
	}
	bad = *c
	bad.Optimizer = bad.Optimizer[:len(bad.Optimizer)-4]
	if _, err := CutState(whole, st, &bad); !errors.Is(err, ErrBadState) {
		t.Errorf("a truncated optimizer state: %v, want ErrBadState", err)
	}
}

// TestJoinStatesInvertsCutState: the whole tiny gpt's state after 2 AdamW
// steps, cut into the stages of two splits and joined again, is the
// whole state byte for byte (parameters and both moments); stages that
// leave a gap, or states of different steps, are refused.
func TestJoinStatesInvertsCutState(t *testing.T) {
	whole := newGPT(t, tinyGPT, 2, 1, 7)
	opt, err := NewOptimizer(OptimConfig{Name: "adamw", LR: 0.01, WeightDecay: 0.1}, whole)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for step := range int64(2) {
		if _, err := whole.ComputeGradients([]Batch{randomTokens(rng, tinyGPT, 2)}, 0, nil); err != nil {
			t.Fatal(err)
		}
		whole.ApplyGradients(opt, step)
	}
	c := whole.Checkpoint(opt, 2, ConfigHash("join"))
	for _, split := range [][]int{{0, 2, 5}, {0, 1, 3, 4, 5}} {
		var stages []*Model
		var cps []*Checkpoint
		for s := range len(split) - 1 {
			st := newStage(t, "gpt", Config{GPT: tinyGPT, MaxBatch: 2}, split[s], split[s+1])
			cut, err := CutState(whole, st, c)
			if err != nil {
				t.Fatal(err)
			}
			stages, cps = append(stages, st), append(cps, cut)
		}
		got, err := JoinStates(whole, stages, cps)
		if err != nil {
			t.Fatalf("split %v: %v", split, err)
		}
		if got.Step != 2 || !slices.Equal(got.Params, c.Params) || !slices.Equal(got.Optimizer, c.Optimizer) {
			t.Errorf("split %v: the joined state (step %d) differs from the whole model's", split, got.Step)
		}
		if _, err := JoinStates(whole, stages[1:], cps[1:]); err == nil {
			t.Errorf("split %v without its first stage: no error", split)
		}
		other := *cps[1]
		other.Step = 3
		if _, err := JoinStates(whole, stages, append([]*Checkpoint{cps[0], &other}, cps[2:]...)); !errors.Is(err, ErrBadState) {
			t.Errorf("split %v with a state of another step: %v, want ErrBadState", split, err)
		}
	}
}
