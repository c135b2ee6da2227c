package train

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/gossip"
)

// settleContext returns the context a pipeline stage settles a step in
// (PipeLearner.Settle: the tied table's exchange and the stages' verdict):
// one that ends with ctx, except when ctx ends because a newer ring epoch
// was adopted (its cause is errEpochChanged). The last stage applies a
// step as it sends its verdict back; a stage that stopped waiting for that
// verdict because the epoch changed would not apply it, and the stages of
// a pipeline without replicas would hold different steps, none of them
// with a holder of every stage. The wait stays bounded: by the pipeline's
// deadlines, and by a neighbour that fails its step, whose reset streams
// fail it at once. stop releases the context.
func settleContext(ctx context.Context) (sctx context.Context, stop func()) {
	sctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	unhook := context.AfterFunc(ctx, func() {
		if cause := context.Cause(ctx); !errors.Is(cause, errEpochChanged) {
			cancel(cause)
		}
	})
	return sctx, func() {
		unhook()
		cancel(nil)
	}
}

// unsettledStep is a step whose gradient a stage settled (it passed the
// pipeline's Commit on) without learning the pipeline's verdict.
type unsettledStep struct {
	stage int
	step  uint64
}

// settleUnsettled is the answer of a pipelined member to an epoch in
// which no step has a holder of every stage (why). When this peer's stage
// settled its gradient for its step without learning the verdict, and a
// member holds another stage at the next step while none holds this
// peer's, the verdict was to apply: a stage applies only on a verdict
// every stage agreed to, and the stages' gradients are averages every
// replica shares. This peer then applies its settled gradient, announces
// the step, and returns an error that has it enter a new epoch, in which
// every stage has a holder at that step. Otherwise it returns why.
func (t *Trainer) settleUnsettled(ctx context.Context, ep gossip.Epoch, steps map[string]uint64, held map[string]int, why error) error {
	u := t.unsettled
	if u == nil || t.stages == nil || u.stage != t.stages.Stage() || u.step != t.step {
		return why
	}
	next, ahead := u.step+1, ""
	for _, p := range ep.Order {
		switch {
		case steps[p] == next && held[p] == u.stage:
			return why // the stage has a holder there: something else is missing
		case steps[p] == next && ahead == "":
			ahead = p
		}
	}
	if ahead == "" {
		return why
	}
	t.unsettled = nil
	t.mu.Lock()
	err := t.l.Apply(ctx, u.step)
	if err == nil {
		t.step, t.hash, t.prevState, t.saved = next, "", nil, 0
		t.trained++
		t.status.Step = next
	}
	t.mu.Unlock()
	if err != nil {
		return err
	}
	hash, err := t.paramHash(ctx)
	if err != nil {
		return err
	}
	if t.payload.Ready != nil {
		t.payload.Ready.Step, t.payload.Ready.Hash = next, hash
	}
	t.publish()
	t.log.Warn("applied a step whose verdict this stage lost: another stage of the pipeline applied it", zap.Uint64("epoch", ep.Number),
		zap.Int("stage", u.stage), zap.Uint64("step", u.step), zap.String("member", ahead), zap.Int("its_stage", held[ahead]))
	return fmt.Errorf("train: stage %d applied step %d after member %s (stage %d) did; entering a new ring epoch with it", u.stage, u.step, ahead, held[ahead])
}
