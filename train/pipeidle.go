package train

import (
	"context"
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/internal/ctxutil"
	"github.com/p2ptrain/p2ptrain/pipeline"
)

// This file is the members a pipelined epoch leaves idle: with P members
// and S stages, pipeline.Assign lays out ⌊P/S⌋ pipelines and the last
// P mod S members of the ring order hold no stage in the epoch. They keep
// the stage they hold (a later epoch that gives them a stage fetches that
// stage's state the usual way), serve it to members that need it, and
// wait for the epoch to end. When the pipelines reach train.steps, an idle
// member asks for a new epoch and takes its stage's final state there, so
// that the run ends on every peer.

// idleIn returns ep's layout and whether it leaves this peer idle.
func (t *Trainer) idleIn(ep gossip.Epoch) (pipeline.Assignment, bool) {
	as, err := t.layoutOf(ep)
	if err != nil {
		return as, false
	}
	return as, slices.Contains(as.Idle, t.self)
}

// enterIdle is enterStage for a member ep's layout as leaves idle: it
// keeps its state, unless the members continue from the run's last step,
// whose state of the stage it holds it then fetches from a holder.
func (t *Trainer) enterIdle(ctx context.Context, ep gossip.Epoch, as pipeline.Assignment, steps map[string]uint64, hashes map[string]string, held map[string]int) error {
	t.mu.Lock()
	t.forceSync = false // the stage leader it compared with is not in a ring with it now
	t.mu.Unlock()
	target, want, err := choosePipeState(ep.Order, steps, hashes, held, as.Stages, uint64(t.cfg.Steps))
	if err != nil {
		return t.settleUnsettled(ctx, ep, steps, held, err)
	}
	s := t.stages.Stage()
	if target < uint64(t.cfg.Steps) || (t.step == target && hashes[t.self] == want[s]) {
		return nil
	}
	for _, p := range ep.Order {
		if p != t.self && steps[p] == target && held[p] == s && hashes[p] == want[s] {
			t.wantStage = s
			return t.syncFrom(ctx, p, target, want[s])
		}
	}
	return fmt.Errorf("train: no member holds stage %d at step %d", s, target)
}

// sitIdle waits out ep, in whose layout as this peer holds no stage: it
// logs why once, and returns when the epoch changes, or asks for a new
// epoch when a member of the pipelines announces the run's last step.
func (t *Trainer) sitIdle(ctx context.Context, ep gossip.Epoch, as pipeline.Assignment) error {
	if t.step >= uint64(t.cfg.Steps) {
		return nil
	}
	t.idleLogged.Store(ep.Number)
	t.log.Info("idle in ring epoch: no pipeline stage for this peer", zap.Uint64("epoch", ep.Number), zap.String("layout", as.String()),
		zap.String("why", fmt.Sprintf("%d members hold %d pipelines of %d stages; the last %d of the ring order wait for an epoch that gives them a stage",
			len(ep.Order), as.Replicas, as.Stages, len(as.Idle))),
		zap.Int("held_stage", t.stages.Stage()), zap.Uint64("step", t.step))
	active := slices.Concat(as.Pipelines...)
	for ctxutil.Sleep(ctx, pollInterval) {
		members, cur := t.c.View()
		if !sameEpoch(cur, ep) {
			return nil
		}
		for _, m := range members {
			if slices.Contains(active, m.PeerID) && m.Step >= uint64(t.cfg.Steps) {
				t.log.Info("the pipelines reached the last step: asking for a ring epoch in which to take the final state",
					zap.Uint64("epoch", ep.Number), zap.String("member", m.PeerID), zap.Uint64("step", m.Step))
				t.requestEpoch(ep.Number)
				return nil
			}
		}
	}
	return nil
}
