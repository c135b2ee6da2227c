// Package train runs the data-parallel training loop of one peer: local
// gradients on every device, a ring all-reduce per fusion bucket overlapping
// backward, and the optimizer step. It re-forms on ring-epoch changes,
// retries failed steps and brings peers that fell behind up to date through
// state sync. It sees the running peer only through the Cluster interface.
package train

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/internal/ctxutil"
	"github.com/p2ptrain/p2ptrain/internal/finite"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/pipeline"
	"github.com/p2ptrain/p2ptrain/plan"
	"github.com/p2ptrain/p2ptrain/protocol/statesync"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

// pollInterval is how often the trainer re-reads the membership view while it
// waits for an epoch or for the members of one to be ready.
const pollInterval = 20 * time.Millisecond

// errEpochChanged: a newer epoch was adopted while the trainer waited.
var errEpochChanged = errors.New("train: ring epoch changed")

// Progress is reported after every training step.
type Progress struct {
	Step, Steps  uint64
	Loss         float64
	Accuracy     float64 // last evaluation; negative before the first
	SamplesPerS  float64
	BytesPerStep float64 // all-reduce bytes this peer sent for the step
	Peers        int
	Epoch        uint64
}

// Result is the outcome of a finished training run.
type Result struct {
	Step      uint64
	Loss      float64
	Accuracy  float64
	ParamHash string
	// BitsPerByte is the held-out loss in bits per byte of a byte-level
	// language model (gpt; 0 for the others): Loss / ln 2.
	BitsPerByte float64
	// Retries counts failed attempts at a step (each was retried), and
	// Resyncs the training states this peer took over from a member.
	Retries, Resyncs int
	// Resumed is the step of the checkpoint this run resumed from (0: it
	// started afresh), and Trained the steps this process applied itself
	// (Step less those it took over with a checkpoint or a member's state).
	Resumed, Trained uint64
	// Stages is the number of pipeline stages the model was cut into (0:
	// none; every peer holds the whole model), and Stage the one this peer
	// holds, whose parameters ParamHash hashes.
	Stages, Stage int
}

// Trainer runs the data-parallel step loop of one peer: local gradients on
// every device, a ring all-reduce per fusion bucket overlapping backward, and
// the optimizer step; it re-forms on epoch changes, retries failed steps, and
// brings peers that fell behind (joiners) up to date through state transfer.
type Trainer struct {
	c        Cluster
	self     string
	cfg      config.Train
	arCfg    config.Allreduce
	log      *zap.Logger
	progress func(Progress)
	report   func(Status)
	linger   time.Duration
	// timeline receives a record per step, evaluation and event (never nil).
	timeline telemetry.Sink
	// idleSince is when the last step ended (or Run began), moved on by
	// the evaluations since: the time until the next step starts is waiting
	// (Record.WaitS).
	idleSince time.Time
	// pipeEvalTook is the time of the evaluation through the pipeline that
	// evalPipeline ran, which the next evaluation record adds (evaluate
	// then only reads its figures).
	pipeEvalTook time.Duration
	// retries counts failed attempts at a step.
	retries int

	l      Learner
	codecs []compress.Codec
	// plain are fp32 codecs used instead of low-rank ones for the first
	// max(warmup_steps, lowrank_warmup_steps) steps (as PyTorch's PowerSGD
	// hook does): the first steps move the weights most, and a rank-r
	// factorisation started from a random Q loses too much of them; ACP-SGD,
	// which projects onto a basis one step old, needs the longer start.
	plain    []compress.Codec
	settings Settings
	cfgHash  [32]byte
	// shard is this peer's part of the global batch in the current epoch.
	shard Shard
	// loss is the training loss of the last step; hash the parameter hash
	// after the last change of the parameters ("" when not known).
	loss float64
	hash string
	// mismatches counts parameter hashes that differed from the
	// coordinator's; syncs counts states adopted from another peer.
	mismatches, syncs int
	// resumed is the step of the checkpoint Run resumed from (0: none),
	// trained the steps this process applied, and saved the step of the
	// last checkpoint written or resumed from (0: none).
	resumed, trained, saved uint64
	lastEval                float64
	// checks holds this peer's recent parameter hashes by step, to compare
	// with the coordinator's whenever its check arrives.
	checks map[uint64]string

	// gradHook, when set (tests), sees every local gradient bucket before it is sent.
	gradHook func(step uint64, bucket int, g []float32)

	// payload is what this peer's heartbeats carry; status what it reports.
	// Both are written by the training goroutine only.
	payload Payload
	status  Status

	// minEpoch is the lowest epoch number this peer may train in: after a
	// failure in epoch N it waits for N+1 (which it asked the coordinator for).
	minEpoch uint64
	// strikes counts, per member, the consecutive failed steps blamed on it
	// (train.exclude_after of them exclude it); a completed step clears them.
	strikes map[string]int
	// nonFinite counts consecutive attempts at one step whose averaged
	// gradient was not finite (maxNonFiniteRetries stop the run).
	nonFinite int

	// stages is the learner when it holds a pipeline stage
	// (train.pipeline_stages > 1; nil: pure data parallelism). pipe is the
	// epoch's pipeline while one runs; pipeWaitLogged the last epoch whose
	// layout did not fit; wantStage the stage a state fetch is for;
	// slowestStep the longest step (the pipeline's deadlines).
	stages         *PipeLearner
	pipe           *pipeEpoch
	pipeWaitLogged uint64
	wantStage      int
	slowestStep    time.Duration
	// idleLogged is the last epoch whose layout left this peer idle;
	// auto the state of train.pipeline_stages = "auto" (nil otherwise).
	idleLogged atomic.Uint64
	auto       *autoStages
	// unsettled is the step this peer's stage settled its gradient for
	// and did not learn its pipeline's verdict on (nil: none).
	unsettled *unsettledStep

	// mu guards the parameters, optimizer state and step against the state server.
	mu        sync.Mutex
	step      uint64
	forceSync bool
	// prevState is the stage this peer held before the layout moved it,
	// served until a step completes (pipeline stages only).
	prevState *heldState
	// oversized is the size of the last payload logged as too large for a
	// heartbeat (publish).
	oversized int
}

// Options are a Trainer's optional collaborators.
type Options struct {
	// Log is the logger (nil: none).
	Log *zap.Logger
	// Progress, when set, is called after every step.
	Progress func(Progress)
	// Status, when set, is called whenever the trainer's status changes.
	Status func(Status)
	// Linger bounds how long Run keeps serving the final state after the
	// last step while a live member of the ring is behind, so that a peer
	// whose last round failed can still catch up (or, when the ring's
	// majority failed it, this peer trains it again with them). Run
	// returns at once when every live member has the final step. Give it
	// time for a new epoch and a state transfer: train.ready_timeout and
	// a few failure timeouts.
	Linger time.Duration
	// Train and Test, when set, are the datasets (else they are loaded
	// from train.data_dir); they are only read, so peers may share them.
	Train, Test *data.Dataset
	// GradHook, when set (tests), sees every local gradient bucket before
	// it is sent.
	GradHook func(step uint64, bucket int, g []float32)
	// Telemetry, when set, receives a record for every step, evaluation and
	// training event (failed steps and who was blamed, re-syncs,
	// checkpoints).
	Telemetry telemetry.Sink
	// LayerCosts, when set, are the per-sample layer costs that
	// train.pipeline_stages = "auto" chooses from, instead of the layers'
	// times measured on this peer at start (tests); the processor's
	// costs besides the layers are then not priced.
	LayerCosts []pipeline.LayerCost
	// MeasureWire, when set, measures the transport's processor seconds
	// per message and per byte (node.MeasureWireCost) for the projection
	// of train.pipeline_stages = "auto"; without it messages and bytes
	// cost no processor time there.
	MeasureWire func(ctx context.Context) (message, byte float64, err error)
}

// New builds the built-in model, optimizer and data of the [train]
// settings (NewModelLearner) and a Trainer for them.
//
// With train.sync_every = H > 1 the learner is DiLoCo's outer loop around
// the model (NewDiLoCo): the Trainer's steps are outer steps, train.steps/H
// of them.
func New(c Cluster, cfg config.Train, ar config.Allreduce, o Options) (*Trainer, error) {
	if cfg.PipelineStages > 1 {
		pl, err := NewPipeLearner(cfg, ar.BucketBytes, o.Train, o.Test)
		if err != nil {
			return nil, err
		}
		t, err := NewWithLearner(c, pl, cfg, ar, o)
		if err != nil {
			pl.Close()
			return nil, err
		}
		return t, nil
	}
	ml, err := NewModelLearner(cfg, ar.BucketBytes, o.Train, o.Test)
	if err != nil {
		return nil, err
	}
	if c := ml.Corpus(); c != nil && o.Log != nil {
		o.Log.Named("train").Info("text corpus", zap.String("path", c.Path()), zap.Int("files", c.Files()), zap.Int64("bytes", c.Size()),
			zap.Int("train_bytes", len(c.TrainBytes())), zap.Int("heldout_bytes", len(c.HeldOutBytes())),
			zap.Float64("unigram_bits_per_byte", c.UnigramEntropy()))
	}
	var l Learner = ml
	if cfg.SyncEvery > 1 {
		dc := DiLoCoConfig{H: cfg.SyncEvery, LR: cfg.OuterLR, Momentum: cfg.OuterMomentum, Overlap: cfg.OuterOverlap, Steps: cfg.Steps / cfg.SyncEvery}
		if l, err = NewDiLoCo(context.Background(), ml, dc); err != nil {
			ml.Close()
			return nil, err
		}
		cfg.Steps /= cfg.SyncEvery
	}
	t, err := NewWithLearner(c, l, cfg, ar, o)
	if err != nil {
		l.Close()
		return nil, err
	}
	return t, nil
}

// NewWithLearner returns a Trainer of learner l for the [train] and
// [allreduce] settings, resuming from the latest checkpoint in
// train.checkpoint_dir if one exists. The Trainer owns l: Close closes it.
func NewWithLearner(c Cluster, l Learner, cfg config.Train, ar config.Allreduce, o Options) (*Trainer, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	t := &Trainer{c: c, self: c.Self(), l: l, step: l.Step(), cfg: cfg, arCfg: ar, log: o.Log.Named("train"), progress: o.Progress,
		report: o.Status, linger: o.Linger, gradHook: o.GradHook, lastEval: -1, loss: -1, timeline: o.Telemetry}
	if t.timeline == nil {
		t.timeline = telemetry.Tee(nil)
	}
	t.stages, _ = l.(*PipeLearner)
	if err := t.buildCodecs(); err != nil {
		return nil, err
	}
	t.settings = settingsOf(cfg, ar, l)
	if err := t.initAuto(o); err != nil {
		return nil, err
	}
	t.cfgHash = t.settings.resumeHash()
	t.payload.Devices = l.Devices()
	t.payload.Settings = t.settings.cluster()
	t.status = Status{Active: true, Step: t.step, Steps: uint64(cfg.Steps), Codec: t.codecs[0].Spec(), Loss: -1, Accuracy: -1}
	t.log.Info("training", zap.String("model", t.settings["train.model"]), zap.Int("params", l.NumParams()),
		zap.Int("buckets", len(t.codecs)), zap.String("codec", t.codecs[0].Spec()),
		zap.Strings("devices", l.Devices()), zap.Int("steps", cfg.Steps))
	return t, nil
}

// buildCodecs makes the all-reduce codecs of the learner's buckets.
func (t *Trainer) buildCodecs() error {
	t.codecs, t.plain = nil, nil
	for b := range t.l.Buckets() {
		c, err := t.newCodec(t.arCfg.Codec, b)
		if err != nil {
			return fmt.Errorf("train: allreduce.codec: %w", err)
		}
		t.codecs = append(t.codecs, c)
		if c.Class() == compress.ClassLowRank {
			p, err := t.newCodec("none", b)
			if err != nil {
				return err
			}
			t.plain = append(t.plain, p)
		}
	}
	if len(t.codecs) == 0 {
		return errors.New("train: the model has no parameters")
	}
	return nil
}

// resume restores the latest checkpoint of train.checkpoint_dir, if any,
// after checking that checkpoints can be written there (CheckCheckpointDir).
// A checkpoint past train.steps is refused: the run would have nothing
// to train, and no other member can hold its state.
func (t *Trainer) resume(ctx context.Context) error {
	dir := t.cfg.CheckpointDir
	if dir == "" {
		return nil
	}
	path, err := latestWithin(dir, t.cfg.Steps, t.cfg.SyncEvery) // t.cfg.Steps counts outer steps with DiLoCo
	switch {
	case err != nil:
		return fmt.Errorf("train: %w", err)
	case path == "":
		return nil
	}
	c, err := model.ReadCheckpoint(path, &t.cfgHash)
	if err != nil {
		return fmt.Errorf("train: resume from %s: %w", dir, err)
	}
	if err := t.restore(ctx, c); err != nil {
		return fmt.Errorf("train: resume from %s: %w", t.cfg.CheckpointDir, err)
	}
	t.log.Info("resumed from checkpoint", zap.Int64("step", c.Step), zap.String("param_hash", t.hash))
	t.resumed, t.saved = uint64(c.Step), uint64(c.Step)
	t.event(telemetry.EventResumed, "", path)
	return nil
}

// restore replaces the learner's state with c and records its step and
// parameter hash.
func (t *Trainer) restore(ctx context.Context, c *model.Checkpoint) error {
	if t.stages != nil && t.wantStage != t.stages.Stage() {
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.switchStage(t.wantStage, c, uint64(c.Step))
	}
	if want := 4 * uint64(t.l.NumParams()); uint64(len(c.Params)) != want {
		return fmt.Errorf("train: a state of %d parameter bytes, the model has %d", len(c.Params), want)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.l.Restore(ctx, c); err != nil {
		return err
	}
	if back := t.step - min(t.step, uint64(c.Step)); back > 0 {
		t.trained -= min(t.trained, back) // steps rolled back are trained again
	}
	t.step = uint64(c.Step)
	t.saved = 0 // another state: a checkpoint at this step may hold the one it replaced
	t.hash = ""
	t.status.Step = t.step
	_, err := t.paramHash(ctx)
	return err
}

// paramHash returns the parameter hash, asking the learner only when the
// parameters changed since it was last computed.
func (t *Trainer) paramHash(ctx context.Context) (string, error) {
	if t.hash != "" {
		return t.hash, nil
	}
	p, err := t.l.Params(ctx)
	if err != nil {
		return "", err
	}
	t.hash = model.HashFloats(p)
	t.status.ParamHash = t.hash
	return t.hash, nil
}

// publish sends the payload and reports the status.
func (t *Trainer) publish() {
	b := t.payload.Encode()
	if len(b) > gossip.MaxAppBytes && len(b) != t.oversized {
		// Every member refuses such a heartbeat: this peer would look dead.
		t.oversized = len(b)
		t.log.Error("this peer's heartbeat payload is too large: the members will refuse its heartbeats",
			zap.Int("bytes", len(b)), zap.Int("max_bytes", gossip.MaxAppBytes), zap.Int("settings", len(t.payload.Settings)))
	}
	t.c.Announce(b, t.step)
	if t.report != nil {
		t.report(t.status)
	}
}

// Close stops serving state and closes the learner.
func (t *Trainer) Close() {
	t.c.ServeState(nil)
	if ss, ok := t.c.(StageStates); ok && t.auto != nil {
		ss.ServeStageState(nil)
	}
	if err := t.l.Close(); err != nil {
		t.log.Warn("closing the learner", zap.Error(err))
	}
}

// serveState snapshots the state after step completed steps for peer
// from, which must be a member of this peer's current ring epoch. The
// snapshot is copied under the trainer's lock and serialized outside it.
func (t *Trainer) serveState(from string, step uint64) ([]byte, error) {
	_, ep := t.c.View()
	if !slices.Contains(ep.Order, from) {
		return nil, fmt.Errorf("%w: %s is not a member of ring epoch %d", statesync.ErrRefused, from, ep.Number)
	}
	t.mu.Lock()
	pipelined := t.stages != nil // train.pipeline_stages = auto replaces the learner under t.mu
	t.mu.Unlock()
	if pipelined {
		return t.servePipeState(from, step, ep)
	}
	t.mu.Lock()
	if t.step != step {
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: at step %d", statesync.ErrUnavailable, t.step)
	}
	c, err := t.l.State(step)
	hash := t.cfgHash
	t.mu.Unlock()
	if err != nil {
		if errors.Is(err, ErrStateUnavailable) {
			err = fmt.Errorf("%w: %w", statesync.ErrUnavailable, err)
		}
		return nil, err
	}
	c.ConfigHash = hash
	return c.Marshal(), nil
}

// Run trains until train.steps, then evaluates and returns the result. It
// returns early with ctx's error. When train.checkpoint_dir is set and
// the final checkpoint could not be written, it returns the result with
// an error.
func (t *Trainer) Run(ctx context.Context) (Result, error) {
	if err := t.resume(ctx); err != nil {
		return Result{}, err
	}
	if _, err := t.paramHash(ctx); err != nil {
		return Result{}, err
	}
	if err := t.measureLayers(ctx); err != nil {
		return Result{}, err
	}
	t.publish()
	t.c.ServeState(t.serveState)
	if ss, ok := t.c.(StageStates); ok && t.auto != nil {
		ss.ServeStageState(t.serveStageState)
	}
	t.idleSince = time.Now()
	// rejoin is an epoch whose majority lacks the last step this peer
	// finished: it enters that epoch again (finish).
	var rejoin *gossip.Epoch
	for {
		for t.step < uint64(t.cfg.Steps) || rejoin != nil {
			if err := t.trainIn(ctx, rejoin); err != nil {
				return Result{}, err
			}
			rejoin = nil
		}
		res, behind, err := t.finish(ctx)
		if !errors.Is(err, errMajorityBehind) {
			return res, err
		}
		t.log.Warn("the ring's majority did not complete the last step: training it again with them",
			zap.Uint64("epoch", behind.Number), zap.Uint64("step", t.step))
		rejoin = &behind
	}
}

// errMajorityBehind is finish's answer when an epoch this peer is a
// member of holds a majority one step or more behind its final state.
var errMajorityBehind = errors.New("train: the ring's majority is behind this peer's final step")

// trainIn waits for a ring epoch (or takes rejoin when it is not nil),
// enters it and trains in it until it ends. It returns an error only when
// training cannot go on.
func (t *Trainer) trainIn(ctx context.Context, rejoin *gossip.Epoch) error {
	var ep gossip.Epoch
	if rejoin != nil {
		ep = *rejoin
	} else {
		var err error
		if ep, err = t.waitEpoch(ctx); err != nil {
			return err
		}
	}
	if err := t.enter(ctx, ep); err != nil {
		if errors.Is(err, errEpochChanged) {
			return nil
		}
		if errors.Is(err, ErrSettingsDiffer) || errors.Is(err, ErrLearner) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t.log.Warn("could not enter the ring epoch; asking for a new one", zap.Uint64("epoch", ep.Number), zap.Error(err))
		t.requestEpoch(ep.Number)
		return nil
	}
	if err := t.runEpoch(ctx, ep); err != nil {
		return err
	}
	return ctx.Err()
}

// waitEpoch waits for an adopted epoch that includes this peer and has at
// least train.min_peers members.
func (t *Trainer) waitEpoch(ctx context.Context) (gossip.Epoch, error) {
	self := t.self
	var logged uint64
	defer t.setWaiting("")
	for {
		_, ep := t.c.View()
		if ep.Number >= t.minEpoch && slices.Contains(ep.Order, self) && len(ep.Order) >= t.cfg.MinPeers && t.pipeFits(ep) {
			return ep, nil
		}
		why := ""
		if ep.Number != 0 && len(ep.Order) < t.cfg.MinPeers {
			why = fmt.Sprintf("for peers: ring epoch %d has %d of the %d members train.min_peers asks for", ep.Number, len(ep.Order), t.cfg.MinPeers)
			if ep.Number != logged {
				t.log.Info("waiting for peers", zap.Uint64("epoch", ep.Number), zap.Int("have", len(ep.Order)), zap.Int("min_peers", t.cfg.MinPeers))
				logged = ep.Number
			}
		}
		t.setWaiting(why) // only the reasons it can name; reported when it changes
		if !ctxutil.Sleep(ctx, pollInterval) {
			return gossip.Epoch{}, ctx.Err()
		}
	}
}

// setWaiting reports why the trainer waits (Status.Waiting) when that
// changes.
func (t *Trainer) setWaiting(why string) {
	if t.status.Waiting == why {
		return
	}
	t.status.Waiting = why
	if why != "" {
		t.status.SamplesPerS = 0 // it trains nothing while it waits
	}
	if t.report != nil {
		t.report(t.status)
	}
}

// readyIn returns the step, parameter hash and stage that each member
// announced itself ready with in ep (this peer's own included).
func (t *Trainer) readyIn(ep gossip.Epoch, members []gossip.Member) (steps map[string]uint64, hashes map[string]string, held map[string]int) {
	steps, hashes, held = map[string]uint64{}, map[string]string{}, map[string]int{}
	for _, m := range members {
		if r := payloadOf(m).Ready; r.In(ep) {
			steps[m.PeerID], hashes[m.PeerID], held[m.PeerID] = r.Step, r.Hash, r.Stage
		}
	}
	steps[t.self], hashes[t.self], held[t.self] = t.step, t.payload.Ready.Hash, t.heldStage()
	return steps, hashes, held
}

// enter announces this peer ready in ep, waits for every member, and brings
// this peer's state up to the most advanced member's.
func (t *Trainer) enter(ctx context.Context, ep gossip.Epoch) error {
	hash, err := t.paramHash(ctx)
	if err != nil {
		return err
	}
	t.payload.Ready = &Ready{Epoch: ep.Number, Digest: ep.Digest(), Step: t.step, Hash: hash, Stage: t.heldStage()}
	t.publish()
	var target uint64
	var ready map[string]uint64
	var hashes map[string]string
	var held map[string]int
	deadline := time.Now().Add(t.cfg.ReadyTimeout.D())
	for {
		members, cur := t.c.View()
		if !sameEpoch(cur, ep) {
			return errEpochChanged
		}
		ready, hashes, held = t.readyIn(ep, members)
		all := true
		for _, p := range ep.Order {
			_, ok := ready[p]
			all = all && ok
		}
		if all {
			// Every member announced its settings with its Ready: refuse to
			// train together before the first step if they differ.
			odd, err := checkSettings(t.settings.cluster(), t.self, members, ep)
			for _, p := range odd {
				t.c.Exclude(p, "announces other training settings (another job)")
			}
			if err != nil {
				return err
			}
			if t.auto != nil {
				// The number of stages, chosen by the coordinator.
				if err := t.settleStages(ctx, ep); err != nil {
					return err
				}
				if err := t.awaitChoice(ctx, ep); err != nil {
					return err
				}
				// A member may have announced another state with the choice
				// (a re-plan's holder joins or cuts its model).
				members, _ = t.c.View()
				ready, hashes, held = t.readyIn(ep, members)
			}
			if t.stages != nil {
				break // enterStage lays out the pipelines
			}
			devices := map[string]int{t.self: len(t.payload.Devices)}
			for _, m := range members {
				if m.PeerID != t.self {
					devices[m.PeerID] = len(payloadOf(m).Devices)
				}
			}
			sh, err := shardOf(ep.Order, t.self, devices, t.cfg.BatchSize)
			if err != nil {
				return err
			}
			t.shard = sh
			break
		}
		if time.Now().After(deadline) {
			slow, elsewhere := lateMembers(ep, members, ready)
			for _, p := range slow {
				t.c.Exclude(p, fmt.Sprintf("not ready in ring epoch %d within train.ready_timeout (%s)", ep.Number, t.cfg.ReadyTimeout.D()))
			}
			for _, p := range elsewhere {
				t.strike(p, fmt.Errorf("not ready in ring epoch %d: it announces another epoch", ep.Number))
			}
			late := slices.Concat(slow, elsewhere)
			return fmt.Errorf("train: members %s did not get ready in ring epoch %d within %s", strings.Join(late, ", "), ep.Number, t.cfg.ReadyTimeout.D())
		}
		if !ctxutil.Sleep(ctx, pollInterval) {
			return ctx.Err()
		}
	}
	if t.stages != nil {
		if err := t.enterStage(ctx, ep, ready, hashes, held); err != nil {
			return err
		}
		return t.afterEnter(ep)
	}
	target, want := chooseState(ep.Order, ready, hashes, uint64(t.cfg.Steps))
	if target == 0 && hashes[ep.Coordinator] != "" {
		// Nobody has trained yet: start from the coordinator's parameters
		// (an external learner's process may not have seeded its model
		// like the others; the built-in models all start alike).
		want = hashes[ep.Coordinator]
	}
	t.mu.Lock()
	behind, force := t.step != target || (want != "" && hashes[t.self] != want), t.forceSync
	t.mu.Unlock()
	self := t.self
	if t.step > target && behind {
		t.log.Warn("the epoch's majority holds another state: discarding this peer's own",
			zap.Uint64("own_step", t.step), zap.Uint64("majority_step", target), zap.Uint64("steps_discarded", t.step-target))
	}
	// A forced re-sync (this peer's hash differed from the coordinator's)
	// is moot once both announce the same state: one of them took the
	// other's meanwhile.
	force = force && ep.Coordinator != self && hashes[ep.Coordinator] != hashes[self]
	if !behind && !force {
		t.mu.Lock()
		t.forceSync = false
		t.mu.Unlock()
		return t.afterEnter(ep)
	}
	// Fetch it from the coordinator if it holds it, else from the lowest
	// peer ID that does.
	src := ""
	for _, p := range append([]string{ep.Coordinator}, ep.Order...) {
		if p != self && ready[p] == target && hashes[p] == want {
			src = p
			break
		}
	}
	if src == "" {
		return fmt.Errorf("train: no member holds step %d", target)
	}
	if err := t.syncFrom(ctx, src, target, want); err != nil {
		return err
	}
	return t.afterEnter(ep)
}

// chooseState picks the training state the members of an epoch continue
// from, given each member's announced step and parameter hash: the (step,
// hash) most members announce, counting only members past step 0 (a fresh
// peer holds the seeded initial state, not a lineage of work); ties go to
// the higher step, then the lower hash, so every member picks the same.
// One member claiming a far higher step cannot outvote the others, and a
// claim above limit (train.steps: no honest peer gets there) is ignored.
// With every member at step 0 it returns step 0 and no hash.
func chooseState(order []string, steps map[string]uint64, hashes map[string]string, limit uint64) (uint64, string) {
	type state struct {
		step uint64
		hash string
	}
	count := map[state]int{}
	for _, p := range order {
		if s := steps[p]; s > 0 && s <= limit {
			count[state{s, hashes[p]}]++
		}
	}
	var best state
	n := 0
	for st, c := range count {
		if c > n || (c == n && (st.step > best.step || (st.step == best.step && st.hash < best.hash))) {
			best, n = st, c
		}
	}
	return best.step, best.hash
}

// syncFrom replaces this peer's state with peer src's at step. The state
// must have parameter hash want when want is not empty, and finite
// parameters.
func (t *Trainer) syncFrom(ctx context.Context, src string, step uint64, want string) error {
	t.log.Info("fetching training state", zap.String("from", src), zap.Uint64("step", step))
	before := t.heldStage()
	b, err := t.c.FetchState(ctx, src, step, t.l.MaxStateBytes())
	if err != nil {
		if ctx.Err() == nil {
			// A member that announces a state and never serves it would
			// otherwise hold the others back for good.
			t.strike(src, fmt.Errorf("its training state could not be fetched: %w", err))
		}
		return err
	}
	c, got, err := t.checkState(src, step, want, b)
	if err != nil {
		// An honest member serves the state it announced: one that serves
		// another is left out at once.
		t.c.Exclude(src, "served an invalid training state: "+err.Error())
		return err
	}
	if err := t.restore(ctx, c); err != nil {
		return fmt.Errorf("train: restoring the state from %s: %w", src, err)
	}
	if t.hash != got {
		return fmt.Errorf("train: after restoring the state from %s the parameters hash to %s, not %s", src, t.hash, got)
	}
	t.mu.Lock()
	t.syncs++
	t.forceSync = false
	t.mu.Unlock()
	clear(t.checks)            // hashes of the replaced state mean nothing now
	plan.ResetCodecs(t.codecs) // a peer that takes over someone's state starts with zero residuals
	hash := t.hash
	// The check this peer gossiped was of the state it just replaced: a
	// member fetching from it would refuse the new state for not matching.
	t.payload.Check = nil
	if t.cfg.CheckEvery > 0 && step%uint64(t.cfg.CheckEvery) == 0 {
		t.payload.Check = &ParamCheck{Step: step, Hash: hash, Stage: t.heldStage()}
	}
	// A member that moved to another pipeline stage keeps announcing the
	// one it left, which it still serves (servePipeState): members that
	// enter this epoch later must find a holder of it; its next Ready
	// announces the new stage.
	if t.payload.Ready != nil && t.heldStage() == before {
		t.payload.Ready.Step, t.payload.Ready.Hash, t.payload.Ready.Stage = step, hash, t.heldStage()
	}
	t.publish()
	t.log.Info("training state synchronised", zap.String("from", src), zap.Uint64("step", step), zap.String("param_hash", hash))
	t.event(telemetry.EventResync, src, "took over its training state at step "+strconv.FormatUint(step, 10))
	return nil
}

// checkState decodes and checks a state downloaded from src: the same
// configuration and step, parameter hash want (when not empty) and the
// hash src announced for the step, finite parameters. It returns the
// state and its parameter hash.
func (t *Trainer) checkState(src string, step uint64, want string, b []byte) (*model.Checkpoint, string, error) {
	c, err := model.UnmarshalCheckpoint(b)
	if err != nil {
		return nil, "", fmt.Errorf("train: state from %s: %w", src, err)
	}
	if c.ConfigHash != t.stateHash(t.wantStage) || uint64(c.Step) != step {
		return nil, "", fmt.Errorf("train: state from %s is for another configuration or step (%d)", src, c.Step)
	}
	sum := sha256.Sum256(c.Params) // the parameter hash: SHA-256 of the little-endian fp32 bytes
	got := hex.EncodeToString(sum[:])
	if want != "" && got != want {
		return nil, "", fmt.Errorf("train: state from %s has parameter hash %s, but the members at step %d announced %s", src, got, step, want)
	}
	if i := finite.FirstInBytes(c.Params); i >= 0 {
		return nil, "", fmt.Errorf("train: state from %s holds a non-finite parameter (index %d): refused", src, i)
	}
	// The source gossips its parameter hash every check_every steps: when it
	// announced one for this step and stage, the parameters received must
	// match it. (A member that moved to another stage gossips its new
	// stage's hash and serves the stage it left, of the same step.)
	members, _ := t.c.View()
	for _, m := range members {
		if ck := payloadOf(m).Check; m.PeerID == src && ck != nil && ck.Step == step && ck.Stage == t.wantStage && ck.Hash != got {
			return nil, "", fmt.Errorf("train: state from %s has parameter hash %s, but it announced %s for step %d", src, got, ck.Hash, step)
		}
	}
	return c, got, nil
}

// newCodec returns a codec of spec for bucket b: its layout, this peer's
// seed for random rounding and the cluster's seed for shared factors.
func (t *Trainer) newCodec(spec string, b int) (compress.Codec, error) {
	peerSeed := fnv.New64a()
	peerSeed.Write([]byte(t.self))
	return compress.New(spec, compress.Options{
		Layout:     t.l.Buckets()[b],
		Seed:       peerSeed.Sum64() ^ uint64(b)<<32,
		SharedSeed: t.cfg.Seed ^ uint64(b+1)*0x9e3779b97f4a7c15,
	})
}

// requestEpoch asks for an epoch above current and refuses to train in
// any epoch numbered current or below.
func (t *Trainer) requestEpoch(current uint64) {
	t.minEpoch = max(t.minEpoch, current+1)
	t.c.RequestEpoch(current)
}

// runEpoch trains in ep until the epoch changes, a round fails, or the run
// ends. It returns an error only when training cannot go on: a local device
// failed (*model.DeviceError).
func (t *Trainer) runEpoch(ctx context.Context, ep gossip.Epoch) error {
	var spec plan.EpochSpec
	if t.stages != nil {
		if t.step >= uint64(t.cfg.Steps) {
			return nil // entered only to take the final state
		}
		if as, idle := t.idleIn(ep); idle {
			return t.sitIdle(ctx, ep, as)
		}
		// This peer's stage of a pipeline, and the ring of the stage's replicas.
		var err error
		if spec, t.pipe, err = t.beginPipe(ep); err != nil {
			t.log.Error("cannot start the pipeline stage", zap.Error(err))
			t.requestEpoch(ep.Number)
			return nil
		}
	} else {
		spec = plan.NewEpochSpec(ep, t.self, t.arCfg.Session(t.log.Named("allreduce")), t.arCfg.Codec, t.c.LinkMatrix(ep.Order))
	}
	links := spec.LinkCodecs(len(t.codecs), func(b int, s string) (compress.Codec, error) { return t.newCodec(s, b) })
	for _, note := range spec.Notes {
		t.log.Warn(note)
	}
	if links != nil {
		w := len(ep.Order)
		t.log.Info("per-link codecs", zap.Uint64("epoch", ep.Number), zap.String("send", spec.LinkEdges[spec.Rank]),
			zap.String("recv", spec.LinkEdges[(spec.Rank+w-1)%w]), zap.String("final", spec.FinalCodec))
	}
	rank := spec.Rank
	tr := t.c.OpenTransport(spec.Ring)
	sess, err := allreduce.NewSession(spec.Ring, tr, spec.Session)
	if err != nil {
		tr.Reset(err)
		if pe := t.pipe; pe != nil {
			t.pipe = nil
			t.endPipe(pe, err)
		}
		t.log.Error("cannot start all-reduce session", zap.Error(err))
		t.requestEpoch(ep.Number)
		return nil
	}
	plan.StartCodecs(t.codecs)
	t.log.Info("training in ring epoch", zap.Uint64("epoch", ep.Number), zap.Int("peers", len(ep.Order)),
		zap.Int("rank", rank), zap.Uint64("step", t.step))
	// A newer epoch cancels the round in flight rather than letting it wait
	// for frames from members the new epoch dropped.
	stepCtx, cancelStep := context.WithCancelCause(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for ctxutil.Sleep(stepCtx, pollInterval) {
			if _, cur := t.c.View(); !sameEpoch(cur, ep) {
				cancelStep(errEpochChanged)
				return
			}
		}
	}()
	defer func() {
		cancelStep(nil)
		<-watchDone
	}()
	// failed: the epoch broke (its transport is reset); retry: the epoch is
	// healthy but the step must be retried in a new one.
	failed, retry, committed := false, false, false
	var fatal error
	for t.step < uint64(t.cfg.Steps) && ctx.Err() == nil {
		if _, cur := t.c.View(); !sameEpoch(cur, ep) {
			break
		}
		if err := t.runStep(stepCtx, sess, links, len(ep.Order), ep.Number); err != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(context.Cause(stepCtx), errEpochChanged) {
				t.log.Info("a newer ring epoch cancelled the step in flight; retrying it there", zap.Uint64("step", t.step))
				t.retries++
				t.event(telemetry.EventStepFailed, "", "a newer ring epoch cancelled the step in flight")
				plan.ResetCodecs(t.codecs)
				failed = true
				break
			}
			if de := (*model.DeviceError)(nil); errors.As(err, &de) || errors.Is(err, errNonFinite) || errors.Is(err, ErrLearner) {
				// Retrying on a device that failed would only fail again.
				fatal = fmt.Errorf("train: training stopped at step %d: %w", t.step, err)
				failed = true
				break
			}
			if errors.Is(err, errNonFiniteAverage) {
				// The round itself succeeded: every member holds the same
				// average and decides alike. Close the epoch cleanly (the
				// last frames still reach the others) and retry the step
				// in the next one.
				if t.nonFinite++; t.nonFinite >= maxNonFiniteRetries {
					fatal = fmt.Errorf("train: training stopped at step %d: %w %d times in a row (lower train.lr, set train.clip_norm, or allreduce.robust)", t.step, err, t.nonFinite)
				} else {
					t.log.Warn("step not applied; retrying it in a new ring epoch", zap.Uint64("step", t.step), zap.Error(err))
				}
				t.retries++
				t.event(telemetry.EventStepFailed, "", err.Error())
				plan.ResetCodecs(t.codecs)
				retry = true
				break
			}
			t.log.Warn("step failed; retrying it in a new ring epoch", zap.Uint64("step", t.step), zap.Error(err))
			t.retries++
			t.event(telemetry.EventStepFailed, blamed(err), err.Error())
			t.blame(err, ep)
			plan.ResetCodecs(t.codecs)
			failed = true
			break
		}
		if !committed {
			t.c.Commit(ep.Number)
			committed = true
		}
		clear(t.strikes)
		t.nonFinite = 0
		// Not stepCtx: a newer epoch need not cancel an evaluation, whose
		// waits are bounded by the pipeline's deadlines.
		if err := t.evalPipeline(ctx, ep); err != nil {
			failed = true // the pipeline holds the evaluation's messages: reset it
			break
		}
		if t.checkParams(ep) {
			failed = true
			break
		}
	}
	if pe := t.pipe; pe != nil {
		// First: a failed step resets the pipeline's streams, so that its
		// other stages fail at once rather than at a deadline.
		t.pipe = nil
		var why error
		if failed || ctx.Err() != nil {
			why = errEpochChanged
		}
		t.endPipe(pe, why)
	}
	sess.Close()
	if failed || ctx.Err() != nil {
		tr.Reset(errEpochChanged)
		t.requestEpoch(ep.Number)
		return fatal
	}
	tr.Close()
	if retry {
		t.requestEpoch(ep.Number)
	}
	return fatal
}

// runStep computes, all-reduces and applies one step.
// links, when not nil, are each bucket's per-link codecs.
func (t *Trainer) runStep(ctx context.Context, sess *allreduce.Session, links []*allreduce.LinkCodecs, world int, epoch uint64) error {
	start := time.Now()
	step := t.step
	sh := t.shard
	t.unsettled = nil // Compute replaces the gradient
	sentBefore := sess.Queued()
	var pipeBefore uint64
	if t.pipe != nil {
		pipeBefore = t.pipe.tr.Sent()
	}
	round := sess.NewRound(ctx, step)
	var addErr error
	grads := make([][]float32, 0, len(t.codecs))
	loss, cerr := t.l.Compute(ctx, step, sh, func(b int, g []float32) {
		grads = append(grads, g)
		if t.gradHook != nil {
			t.gradHook(step, b, g)
		}
		if model.HasNonFinite(g) {
			t.log.Error("non-finite local gradient: contributing zeros for this bucket", zap.Uint64("step", step), zap.Int("bucket", b))
			clear(g)
		}
		if sh.Weight != 1 { // members with more devices weigh more in the ring's plain average
			for i := range g {
				g[i] *= sh.Weight
			}
		}
		codec := t.codecs[b]
		if t.plain != nil && step < uint64(max(t.cfg.WarmupSteps, t.cfg.LowRankWarmupSteps)) {
			codec = t.plain[b]
		}
		// In place: a failed step is retried with a gradient computed (or
		// copied from the training process) anew, so g need not survive it.
		bk := allreduce.Bucket{ID: uint32(b), Codec: codec, Data: g, Out: g, InPlace: true}
		if links != nil {
			bk.Links = links[b]
		}
		if err := round.Add(bk); err != nil && addErr == nil {
			addErr = err
		}
	})
	computed := time.Now()
	werr := round.Wait()
	if err := errors.Join(cerr, addErr, werr); err != nil {
		return err
	}
	if t.stages != nil {
		// The tied table's other part, and the pipeline's verdict: a step
		// any stage cannot apply is applied by none.
		sctx, stop := settleContext(ctx)
		last, apply, err := t.stages.Settle(sctx, step)
		stop()
		if err != nil {
			t.unsettled = &unsettledStep{stage: t.stages.Stage(), step: step}
			return err
		}
		if !apply {
			return fmt.Errorf("%w at step %d (on this stage or another of the pipeline)", errNonFiniteAverage, step)
		}
		loss = last
	} else if (world > 1 || sh.Weight != 1) && slices.ContainsFunc(grads, model.HasNonFinite) {
		// Every peer holds the same average: none applies it, and the step
		// is retried (the codecs' residuals are reset). A ring of one skips
		// this second scan: its all-reduce averages nothing and runs no
		// codec, so each bucket is what ready checked (and did not scale).
		return fmt.Errorf("%w at step %d", errNonFiniteAverage, step)
	}
	reduced := time.Now()
	t.mu.Lock()
	err := t.l.Apply(ctx, step)
	if err == nil {
		t.step++
		t.trained++
		t.hash = ""
		t.prevState = nil // every member of the epoch holds its stage now
	}
	t.mu.Unlock()
	if err != nil {
		return err
	}
	end := time.Now()
	t.noteStepTime(end.Sub(start))
	elapsed := end.Sub(start).Seconds()
	sent := float64(sess.Queued() - sentBefore) // counted when queued: Wait may return before the last frames are written
	if t.pipe != nil {
		sent += float64(t.pipe.tr.Sent() - pipeBefore) // activations, their gradients, the tied table
		t.noteLinkCodecs(t.pipe, step)
	}
	samples := float64(sh.Global)
	allreduceS := reduced.Sub(computed).Seconds()
	t.timeline.Add(telemetry.Record{Kind: telemetry.KindStep, Time: end, Step: t.step, Steps: uint64(t.cfg.Steps),
		Loss: loss, SamplesPerS: samples / elapsed, BytesSent: sent, StepS: elapsed, ComputeS: elapsed - allreduceS,
		AllreduceS: allreduceS, WaitS: max(start.Sub(t.idleSince).Seconds(), 0), Codec: t.codecs[0].Spec(), Peers: world, Epoch: epoch})
	t.idleSince = end
	t.loss = loss
	t.status.Step, t.status.Loss, t.status.SamplesPerS, t.status.BytesPerStep = t.step, loss, samples/elapsed, sent
	if err := t.afterStep(ctx); err != nil {
		return err
	}
	t.publish()
	if t.progress != nil {
		t.progress(Progress{Step: t.step, Steps: uint64(t.cfg.Steps), Loss: loss, Accuracy: t.lastEval,
			SamplesPerS: samples / elapsed, BytesPerStep: sent, Peers: world, Epoch: epoch})
	}
	return nil
}

// event records a training event about member peer ("" for none).
func (t *Trainer) event(name, peer, msg string) {
	t.timeline.Add(telemetry.Record{Kind: telemetry.KindEvent, Step: t.step, Event: name, Peer: peer, Message: msg})
}

// blamed returns the member a failed step's error names, or "".
func blamed(err error) string {
	var pe *allreduce.PeerError
	if errors.As(err, &pe) {
		return string(pe.Peer)
	}
	var ce culprit
	if errors.As(err, &ce) {
		return ce.Culprit()
	}
	return ""
}

// culprit is an error that names the peer held responsible (a
// *pipestream.PeerError).
type culprit interface {
	error
	Culprit() string
}

// errNonFinite marks a run stopped because its parameters are not finite.
var errNonFinite = errors.New("train: parameters are not finite")

// errDiverged marks a run stopped because its final loss is not finite
// while its parameters are.
var errDiverged = errors.New("train: the model diverged")

// errNonFiniteAverage marks a step whose averaged gradient was not finite:
// it is not applied and not counted; maxNonFiniteRetries attempts in a row
// stop the run.
var errNonFiniteAverage = errors.New("train: the averaged gradient is not finite")

const maxNonFiniteRetries = 3

// blame counts a failed step against the member its error names (a frame
// that came late, never, or invalid; not an abort, which the aborting peer
// sends when its own step was cancelled). train.exclude_after consecutive
// failures blamed on one member exclude it from ring epochs for a back-off,
// so the others train on without it.
func (t *Trainer) blame(err error, ep gossip.Epoch) {
	p := blamed(err)
	if p == "" || p == t.self || !slices.Contains(ep.Order, p) {
		return
	}
	switch {
	case errors.Is(err, allreduce.ErrTimeout), errors.Is(err, allreduce.ErrPeerFailed), errors.Is(err, allreduce.ErrBadFrame),
		errors.Is(err, allreduce.ErrFrameTooLarge), errors.Is(err, allreduce.ErrCodecMismatch):
	default:
		return
	}
	t.strike(p, err)
}

// strike counts one more consecutive failure against member p;
// train.exclude_after of them exclude it.
func (t *Trainer) strike(p string, why error) {
	if t.strikes == nil {
		t.strikes = map[string]int{}
	}
	t.strikes[p]++
	if n := t.strikes[p]; n >= t.cfg.ExcludeAfter {
		delete(t.strikes, p)
		t.c.Exclude(p, fmt.Sprintf("%d consecutive failures blamed on it, the last: %v", n, why))
	}
}

// checkFinite returns an error wrapping errNonFinite when a parameter is
// NaN or ±Inf: training on, or reporting a result, would only spread it.
// It also records the parameter hash.
func (t *Trainer) checkFinite(ctx context.Context) error {
	p, err := t.l.Params(ctx)
	if err != nil {
		return err
	}
	if model.HasNonFinite(p) {
		return fmt.Errorf("%w after step %d: stopping (lower train.lr, or set train.clip_norm)", errNonFinite, t.step)
	}
	t.hash = model.HashFloats(p)
	t.status.ParamHash = t.hash
	return nil
}

// afterStep runs the periodic work: evaluation, the parameter hash and
// finiteness check, checkpoints.
func (t *Trainer) afterStep(ctx context.Context) error {
	s := int(t.step)
	if t.cfg.EvalEvery > 0 && s%t.cfg.EvalEvery == 0 && s < t.cfg.Steps {
		_, _ = t.evaluate() // logged; a device error also fails the next step
	}
	if t.cfg.CheckEvery > 0 && s%t.cfg.CheckEvery == 0 {
		if err := t.checkFinite(ctx); err != nil {
			return err
		}
		if t.checks == nil {
			t.checks = map[uint64]string{}
		}
		t.checks[t.step] = t.hash
		delete(t.checks, t.step-uint64(16*t.cfg.CheckEvery))
		t.payload.Check = &ParamCheck{Step: t.step, Hash: t.hash, Stage: t.heldStage()} // published after the step: the others compare promptly
	}
	if t.cfg.CheckpointDir != "" && t.cfg.CheckpointEvery > 0 && s%t.cfg.CheckpointEvery == 0 {
		_ = t.checkpoint() // logged; the final checkpoint's failure fails the run
	}
	return nil
}

// evaluate measures the model on held-out data, if the learner has any.
func (t *Trainer) evaluate() (model.Stats, error) {
	began := time.Now()
	st, err := t.l.Evaluate()
	took := time.Since(began)
	t.idleSince = t.idleSince.Add(took)           // the next step's wait leaves it out
	took, t.pipeEvalTook = took+t.pipeEvalTook, 0 // a pipeline's evaluation ran before (evalPipeline)
	if errors.Is(err, ErrNoEvaluation) {
		return model.Stats{Loss: t.loss}, err
	}
	if err != nil {
		t.log.Error("evaluation failed", zap.Error(err))
		return st, err
	}
	t.lastEval = st.Accuracy()
	t.status.Accuracy = st.Accuracy()
	fields := []zap.Field{zap.Uint64("step", t.step), zap.Float64("test_loss", st.Loss), zap.Float64("test_accuracy", st.Accuracy())}
	if t.cfg.Model == "gpt" {
		fields = append(fields, zap.Float64("bits_per_byte", data.BitsPerByte(st.Loss)))
	}
	t.log.Info("evaluation", fields...)
	rec := telemetry.Record{Kind: telemetry.KindEval, Step: t.step, TestLoss: &st.Loss, EvalS: took.Seconds()}
	if acc := st.Accuracy(); t.cfg.Model != "gpt" {
		rec.Accuracy = &acc
	} else {
		bpb := data.BitsPerByte(st.Loss)
		rec.BitsPerByte = &bpb
	}
	t.timeline.Add(rec)
	return st, nil
}

// checkpoint writes the state after t.step steps into
// train.checkpoint_dir. A failure is logged and returned: a periodic
// checkpoint's does not stop the run, the final one's fails it (finish).
func (t *Trainer) checkpoint() error {
	t.mu.Lock()
	c, err := t.l.State(t.step)
	t.mu.Unlock()
	if err == nil {
		c.ConfigHash = t.cfgHash
		var path string
		if path, err = model.WriteCheckpoint(t.cfg.CheckpointDir, c, 0); err == nil {
			t.log.Info("checkpoint written", zap.String("path", path), zap.Uint64("step", t.step))
			t.event(telemetry.EventCheckpoint, "", path)
			t.saved = t.step
			return nil
		}
	}
	t.log.Error("checkpoint failed", zap.Uint64("step", t.step), zap.String("dir", t.cfg.CheckpointDir), zap.Error(err))
	return err
}

// checkParams compares this peer's last parameter hash with the
// coordinator's for the same step (with pipeline stages, its stage
// leader's: stageLeader). On a mismatch it logs an error, marks this peer
// for a re-sync from the coordinator (the stage leader), and returns true.
func (t *Trainer) checkParams(ep gossip.Epoch) bool {
	ref, stage, role := ep.Coordinator, 0, "coordinator"
	if t.stages != nil {
		var ok bool
		if ref, stage, ok = t.stageLeader(ep); !ok {
			return false
		}
		role = "stage leader"
	}
	if ref == t.self || len(t.checks) == 0 {
		return false
	}
	members, _ := t.c.View()
	for _, m := range members {
		c := payloadOf(m).Check
		if m.PeerID != ref || c == nil || c.Stage != stage {
			continue
		}
		mine, ok := t.checks[c.Step]
		if !ok {
			continue
		}
		if c.Hash != mine {
			t.log.Error("parameter hash differs from the "+role+"'s: re-syncing from it",
				zap.Int("stage", stage), zap.Uint64("step", c.Step), zap.String("mine", mine), zap.String(role, c.Hash))
			clear(t.checks)
			t.mismatches++
			t.mu.Lock()
			t.forceSync = true
			t.mu.Unlock()
			return true
		}
	}
	return false
}

// finish evaluates, writes the final checkpoint, and keeps serving state for a
// while so a peer whose last round failed can still catch up. A round can
// complete here and fail elsewhere (a newer epoch cancelled it there): when
// the members of an epoch this peer is in agree on an earlier state by
// majority (chooseState), this peer's last step does not count, and finish
// returns that epoch with errMajorityBehind for Run to train in again
// (not an epoch this peer gave up entering: it waits for a newer one).
// When the final checkpoint could not be written it returns the result
// with an error, once it stopped serving the final state.
func (t *Trainer) finish(ctx context.Context) (Result, gossip.Epoch, error) {
	if err := t.checkFinite(ctx); err != nil {
		return Result{}, gossip.Epoch{}, err
	}
	st, err := t.evaluate()
	if de := (*model.DeviceError)(nil); errors.As(err, &de) {
		return Result{}, gossip.Epoch{}, fmt.Errorf("train: final evaluation: %w", err)
	}
	if math.IsNaN(st.Loss) || math.IsInf(st.Loss, 0) {
		// Finite parameters so large that the loss overflows: the model
		// diverged (a member's huge gradient, or a learning rate too high).
		// A done line with test_loss=NaN would pass for a result.
		return Result{}, gossip.Epoch{}, fmt.Errorf("%w: its loss after step %d is %v although every parameter is finite (lower train.lr, set train.clip_norm, or set allreduce.robust against a member's huge gradients)", errDiverged, t.step, st.Loss)
	}
	var ckptErr error
	if t.cfg.CheckpointDir != "" && t.saved != t.step { // a periodic checkpoint may have written this step
		ckptErr = t.checkpoint()
	}
	res := Result{Step: t.step, Loss: st.Loss, Accuracy: st.Accuracy(), ParamHash: t.hash, Retries: t.retries, Resyncs: t.syncs,
		Resumed: t.resumed, Trained: t.trained}
	if t.pipelined() {
		res.Stages, res.Stage = t.stages.Stages(), t.heldStage()
	}
	if t.cfg.Model == "gpt" {
		res.BitsPerByte = data.BitsPerByte(st.Loss)
	}
	if errors.Is(err, ErrNoEvaluation) {
		res.Accuracy = -1 // the learner evaluates itself; Loss is the last training loss
	}
	t.status.ParamHash = res.ParamHash
	t.publish()
	deadline := time.Now().Add(t.linger)
	self := t.self
	for time.Now().Before(deadline) {
		members, ep := t.c.View()
		// Keep answering new epochs: a peer that joins now syncs to the final state.
		if slices.Contains(ep.Order, self) && !t.payload.Ready.In(ep) {
			t.payload.Ready = &Ready{Epoch: ep.Number, Digest: ep.Digest(), Step: t.step, Hash: res.ParamHash, Stage: t.heldStage()}
			t.confirmStages(ep)
			t.publish()
		}
		done := true
		for _, m := range members {
			if m.PeerID != self && slices.Contains(ep.Order, m.PeerID) && m.Step < t.step && (m.State == gossip.Alive || m.State == gossip.Suspect) {
				done = false
			}
		}
		if ep.Number >= t.minEpoch && t.payload.Ready.In(ep) && majorityBehind(ep, members, t.self, t.payload.Ready, uint64(t.cfg.Steps)) {
			return res, ep, errMajorityBehind
		}
		if done || !ctxutil.Sleep(ctx, pollInterval) {
			break
		}
	}
	if ckptErr != nil {
		return res, gossip.Epoch{}, fmt.Errorf("train: the run finished (%s), but its final checkpoint, of step %d, could not be written: %w", res, t.step, ckptErr)
	}
	return res, gossip.Epoch{}, nil
}

// majorityBehind reports whether every member of ep announced its Ready
// for it and the state they continue from (chooseState) is before the step
// of own, the Ready of self.
func majorityBehind(ep gossip.Epoch, members []gossip.Member, self string, own *Ready, limit uint64) bool {
	steps, hashes := map[string]uint64{}, map[string]string{}
	for _, m := range members {
		if r := payloadOf(m).Ready; r.In(ep) {
			steps[m.PeerID], hashes[m.PeerID] = r.Step, r.Hash
		}
	}
	steps[self], hashes[self] = own.Step, own.Hash
	for _, p := range ep.Order {
		if _, ok := steps[p]; !ok {
			return false
		}
	}
	target, _ := chooseState(ep.Order, steps, hashes, limit)
	return target < own.Step
}

// String formats a result as the final line of a run; a pipeline stage's
// names the stage its parameter hash is of (the replicas of a stage agree,
// the stages differ).
func (r Result) String() string {
	hash := "param_hash=" + r.ParamHash
	if r.Stages > 0 {
		hash = fmt.Sprintf("stage=%d %s", r.Stage, hash)
	}
	if r.Accuracy < 0 {
		return fmt.Sprintf("done step=%d train_loss=%.4f %s", r.Step, r.Loss, hash)
	}
	if r.BitsPerByte > 0 {
		return fmt.Sprintf("done step=%d test_loss=%.4f accuracy=%.4f bits_per_byte=%.4f %s", r.Step, r.Loss, r.Accuracy, r.BitsPerByte, hash)
	}
	return fmt.Sprintf("done step=%d test_loss=%.4f accuracy=%.4f %s", r.Step, r.Loss, r.Accuracy, hash)
}

// lateMembers sorts the members of ep that are not in ready: slow ones
// announce ep itself in their heartbeats (they hold it and still did not
// get ready: a straggler or a member that will not train), elsewhere ones
// announce another epoch. These disagree about the ring, which happens
// honestly (a proposal that reached a peer before the proposer's heartbeat
// saying it trains now was refused, and the peer proposed its own): they
// get a strike, not an exclusion, and the next epoch usually takes them in.
// A member announcing an epoch number no honest member can hold
// (gossip.CheckEpochNumber against ep's) is not disagreeing but forging,
// and counts as slow.
func lateMembers(ep gossip.Epoch, members []gossip.Member, ready map[string]uint64) (slow, elsewhere []string) {
	for _, p := range ep.Order {
		if _, ok := ready[p]; ok {
			continue
		}
		i := slices.IndexFunc(members, func(m gossip.Member) bool { return m.PeerID == p })
		if i >= 0 && !sameEpoch(members[i].Heartbeat.Epoch, ep) && gossip.CheckEpochNumber(members[i].Heartbeat.Epoch.Number, ep.Number) == nil {
			elsewhere = append(elsewhere, p)
		} else {
			slow = append(slow, p)
		}
	}
	return slow, elsewhere
}

// sameEpoch reports whether a and b are one epoch: the same number and
// the same content (gossip may adopt two different rings under one number).
func sameEpoch(a, b gossip.Epoch) bool {
	return a.Number == b.Number && a.Digest() == b.Digest()
}
