package train

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/internal/finite"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/protocol/statesync"
)

// This file is the re-plan of a pipeline under train.pipeline_stages =
// "auto" into another layout: each member that holds a stage of the
// pipeline at the re-plan's step joins every stage's state into the whole
// model's, fetching the stages it lacks from their holders over the
// stage-state protocol, and then trains the new choice from that state.

// gatheredState is the stage a member held when it joined a pipeline's
// stages for a re-plan: it serves it to the other holders, which need it
// after this member has moved on to the new layout.
type gatheredState struct {
	heldState
	// holders are the re-plan's holders, served even once they have left
	// the ring epoch this member is in.
	holders []string
}

// serveStageState answers a stage-state request from peer from: the stage
// this peer held when it joined a re-planned pipeline's stages, or the
// stage it holds now, at step; only to members of its ring epoch and to
// the holders of its last re-plan.
func (t *Trainer) serveStageState(from string, step uint64, stage int) ([]byte, error) {
	_, ep := t.c.View()
	member := slices.Contains(ep.Order, from)
	t.mu.Lock()
	defer t.mu.Unlock()
	if g := t.auto.gathered; g != nil && g.step == step && g.stage == stage && (member || slices.Contains(g.holders, from)) {
		return g.state, nil
	}
	if !member {
		return nil, fmt.Errorf("%w: %s is not a member of ring epoch %d", statesync.ErrRefused, from, ep.Number)
	}
	if t.stages == nil || t.stages.Stage() != stage || t.step != step {
		return nil, fmt.Errorf("%w: holds stage %d at step %d", statesync.ErrUnavailable, t.heldStage(), t.step)
	}
	c, err := t.l.State(step)
	if err != nil {
		return nil, err
	}
	c.ConfigHash = t.stateHash(stage)
	return c.Marshal(), nil
}

// gatherLearner replaces the pipeline stage this peer trains by choice c,
// a re-plan of that pipeline (c.From) at the step this peer holds: it
// keeps its own stage's state to serve, fetches every other stage's from
// a holder that held it (c.HolderStages), checks each against the hash
// the coordinator announced for it, joins them into the whole model's
// state (model.JoinStates), and trains from it the whole model (c.Stages
// = 1) or stage i mod S of c's cut as holder i (PipeLearner.SetStageFrom),
// keeping the step. A failure leaves this peer on its stage: it enters a
// new epoch, whose coordinator settles the choice again.
func (t *Trainer) gatherLearner(ctx context.Context, c StagesChoice) error {
	a := t.auto
	ss, ok := t.c.(StageStates)
	pl := t.stages
	me := slices.Index(c.Holders, t.self)
	if !ok || pl == nil || me < 0 || c.HolderStages[me] != pl.Stage() || !slices.Equal(c.From, []int(pl.Split())) {
		return fmt.Errorf("%w: joining the stages of %v: this peer holds stage %d of %v (a holder: %v)", ErrLearner, c.From, t.heldStage(), pl.Split(), me >= 0)
	}
	S, own := len(c.From)-1, pl.Stage()
	t.mu.Lock()
	step := t.step
	hashes := make([][32]byte, S) // each old stage's ConfigHash
	for s := range hashes {
		hashes[s] = t.stateHash(s)
	}
	st, err := t.l.State(step)
	if err == nil {
		st.ConfigHash = hashes[own]
		a.gathered = &gatheredState{heldState: heldState{stage: own, step: step, state: st.Marshal()}, holders: slices.Clone(c.Holders)}
	}
	t.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: stage %d's state at step %d: %w", ErrLearner, own, step, err)
	}
	max := wholeStateBytes(pl)
	cps := make([]*model.Checkpoint, S)
	cps[own] = st
	for s := range S {
		var errs []error
		for i, h := range c.Holders {
			if cps[s] != nil || c.HolderStages[i] != s || h == t.self {
				continue
			}
			b, err := ss.FetchStageState(ctx, h, step, s, max)
			if err == nil {
				cps[s], err = checkStageState(b, step, hashes[s], c.StageHashes[s])
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("from %s: %w", h, err))
			}
		}
		if cps[s] == nil {
			return fmt.Errorf("train: joining the stages of %v at step %d: no holder served stage %d: %w", c.From, step, s, errors.Join(errs...))
		}
	}
	whole, err := NewModelLearner(a.base, t.arCfg.BucketBytes, a.train, a.test)
	if err != nil {
		return fmt.Errorf("%w: the whole model: %w", ErrLearner, err)
	}
	joined, err := pl.joinStates(whole.Model(), cps)
	if err == nil {
		err = whole.Restore(ctx, joined)
	}
	if err != nil {
		whole.Close()
		return fmt.Errorf("%w: joining the stages of %v at step %d: %w", ErrLearner, c.From, step, err)
	}
	var next Learner = whole
	var npl *PipeLearner
	stage := 0
	if c.Stages > 1 {
		stage = me % c.Stages
		cfg := a.base
		cfg.PipelineStages, cfg.BatchSize = config.Stages(c.Stages), c.Stages*cfg.BatchSize
		npl, err = NewPipeLearner(cfg, t.arCfg.BucketBytes, a.train, a.test)
		if err == nil {
			if err = npl.useSplit(c.Split); err == nil {
				err = npl.SetStageFrom(stage, whole.Model(), joined)
			}
			if err != nil {
				npl.Close()
			}
		}
		if cerr := whole.Close(); cerr != nil {
			t.log.Warn("closing the whole model", zap.Error(cerr))
		}
		if err != nil {
			return fmt.Errorf("%w: cutting the joined model into stage %d of %s: %w", ErrLearner, stage, c, err)
		}
		next = npl
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := pl.Close(); err != nil {
		t.log.Warn("closing the learner", zap.Error(err))
	}
	a.recutAt = step
	return t.useLearner(next, npl, step, stage)
}

// checkStageState parses a stage's state fetched for a re-plan and checks
// it: the old choice's ConfigHash for that stage, the step, the parameter
// hash the coordinator announced, and finite parameters.
func checkStageState(b []byte, step uint64, cfgHash [32]byte, want string) (*model.Checkpoint, error) {
	c, err := model.UnmarshalCheckpoint(b)
	if err != nil {
		return nil, err
	}
	if c.ConfigHash != cfgHash || uint64(c.Step) != step {
		return nil, fmt.Errorf("a state of another configuration, stage or step (%d)", c.Step)
	}
	sum := sha256.Sum256(c.Params)
	if got := hex.EncodeToString(sum[:]); got != want {
		return nil, fmt.Errorf("parameter hash %s, but the stage's holders announced %s", got, want)
	}
	if i := finite.FirstInBytes(c.Params); i >= 0 {
		return nil, fmt.Errorf("a non-finite parameter (index %d)", i)
	}
	return c, nil
}

// wholeStateBytes bounds a state of any of pl's model's stages: four
// vectors of the whole model's parameters, and 1 MiB.
func wholeStateBytes(pl *PipeLearner) uint64 {
	n := 0
	for _, l := range pl.layers {
		n += l.Params
	}
	return uint64(n)*4*4 + 1<<20
}
