package train

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/pipeline"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

// This file is the evaluation of held-out data through a pipeline
// (docs/pipeline.md): a stage holds part of the model and cannot evaluate
// on its own, so after the steps train.eval_every names, and after the
// last step, every peer runs the held-out set through its pipeline within
// the ring epoch (pipeline.Stage.Evaluate), and reports the figures its
// pipeline's last stage computed, as a peer training the whole model
// reports its own.

// EvaluatePipeline runs the held-out set through the epoch's pipeline
// after step completed steps (pipeline.Stage.Evaluate: forward only, no
// change to the parameters) and returns the figures of the pipeline's
// last stage, which every stage of the pipeline returns alike. Evaluate
// returns them from then on, as long as the held stage's parameters are
// the ones evaluated. It must be called between Begin and End, by every
// stage of the pipeline at the same point of the epoch.
func (l *PipeLearner) EvaluatePipeline(ctx context.Context, step uint64) (model.Stats, error) {
	if l.run == nil {
		return model.Stats{}, errors.New("train: pipeline stage outside an epoch")
	}
	l.evalHash = ""
	st, err := l.run.Evaluate(ctx, step, l.test)
	if err != nil {
		return model.Stats{}, err
	}
	l.eval, l.evalHash = st, model.HashFloats(l.m.Params())
	return st, nil
}

// EvalChunks returns the number of chunks an evaluation cuts the held-out
// set into: one per micro-batch of the largest size
// (pipeline.EvalChunks). Every stage computes the same from the
// configuration.
func (l *PipeLearner) EvalChunks() int { return pipeline.EvalChunks(l.test.Len(), l.m.MaxBatch()) }

// evaluated returns the figures of the last evaluation through the
// pipeline while the held stage's parameters are the ones it evaluated.
func (l *PipeLearner) evaluated() (model.Stats, bool) {
	if l.evalHash == "" || l.evalHash != model.HashFloats(l.m.Params()) {
		return model.Stats{}, false
	}
	return l.eval, true
}

// evalPipeline runs the evaluation due after the step just applied in
// ep's pipeline, if one is due: after the steps train.eval_every names,
// which it reports as the trainer reports any evaluation (log line and
// eval record), and after the last step, which finish reports (the final
// line's test_loss, accuracy and bits_per_byte). ctx is the run's: a newer
// ring epoch does not cancel an evaluation, which the pipeline's members
// complete on the epoch's transport. A failed evaluation (a neighbour that
// died, reset its streams or sent a bad message: each wait is bounded by
// the pipeline's deadline) is reported with an eval_failed event, blamed like
// a failed step, and returned: the caller ends the epoch, resetting the
// pipeline, and training goes on in the next one. A failed final
// evaluation leaves the final line with the training loss.
func (t *Trainer) evalPipeline(ctx context.Context, ep gossip.Epoch) error {
	if t.pipe == nil {
		return nil
	}
	s := int(t.step)
	final := s == t.cfg.Steps
	if !final && (t.cfg.EvalEvery <= 0 || s%t.cfg.EvalEvery != 0) {
		return nil
	}
	start := time.Now()
	_, err := t.stages.EvaluatePipeline(ctx, t.step)
	t.pipeEvalTook = time.Since(start)
	t.idleSince = t.idleSince.Add(t.pipeEvalTook) // the next step's wait leaves it out, as evaluate does
	if err != nil {
		t.pipeEvalTook = 0 // no record takes it
		err = fmt.Errorf("train: evaluation through the pipeline after step %d: %w", t.step, err)
		if ctx.Err() != nil {
			return err
		}
		what := "training goes on in a new ring epoch"
		if final {
			what = "the final line reports the training loss"
		}
		t.log.Warn("evaluation failed; "+what, zap.Error(err))
		t.event(telemetry.EventEvalFailed, blamed(err), err.Error())
		t.blame(err, ep)
		return err
	}
	t.log.Debug("evaluated through the pipeline", zap.Uint64("step", t.step), zap.Duration("took", t.pipeEvalTook))
	if !final {
		_, _ = t.evaluate() // the figures just computed: logged and recorded
	}
	return nil
}
