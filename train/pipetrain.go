package train

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/pipeline"
	"github.com/p2ptrain/p2ptrain/plan"
	"github.com/p2ptrain/p2ptrain/protocol/pipestream"
	"github.com/p2ptrain/p2ptrain/protocol/statesync"
)

// This file is the trainer's side of pipeline parallelism
// (train.pipeline_stages > 1, docs/pipeline.md). In each ring epoch the
// members are laid out by pipeline.Assign: pipelines of S consecutive
// members, stage s's replicas at positions s, s+S, … Each peer holds one
// stage (a PipeLearner), runs its part of every step over the epoch's
// pipestream transport, all-reduces the stage's gradients on a ring of
// the stage's replicas only (an allreduce.Session of its own, told apart
// from the other stages' rings by its digest), adds the shared token
// table's other part (SumTied), and applies. A failure anywhere fails the
// step on every peer (the pipeline's streams and the stage rings are reset)
// and the step is retried in the next epoch. When the layout moves a peer
// to another stage, it fetches that stage's state from a holder before it
// lets go of its own, and keeps serving its old stage for the epoch so
// that two peers that swap stages both get theirs.

// PipeOpener is what a Cluster needs to carry pipeline stages' messages
// (package node implements it).
type PipeOpener interface {
	// OpenPipe returns the pipeline transport of this peer's stage in one
	// pipeline of one ring epoch.
	OpenPipe(p pipestream.Pipe) (*pipestream.Transport, error)
}

// heldState is the state of a stage this peer held before the layout
// moved it to another, served to the peer that takes that stage over.
type heldState struct {
	stage int
	step  uint64
	state []byte
}

// pipelined reports whether the trainer runs pipeline stages.
func (t *Trainer) pipelined() bool { return t.stages != nil }

// heldStage returns the stage this peer holds (0 without pipeline stages).
func (t *Trainer) heldStage() int {
	if t.stages == nil {
		return 0
	}
	return t.stages.Stage()
}

// stateHash is the ConfigHash of a state of stage s: the configuration's,
// and the stage when the model is cut, so that a state of another stage is
// never taken for this one.
func (t *Trainer) stateHash(s int) [32]byte {
	if t.stages == nil {
		return t.cfgHash
	}
	return model.ConfigHash(hex.EncodeToString(t.cfgHash[:]), "stage", strconv.Itoa(s))
}

// layoutOf returns ep's layout (the members beyond a multiple of the
// stages idle), or an error saying why ep cannot hold a pipeline: fewer
// members than stages (training waits for members to join).
func (t *Trainer) layoutOf(ep gossip.Epoch) (pipeline.Assignment, error) {
	S := t.stages.Stages()
	if len(ep.Order) < S {
		return pipeline.Assignment{}, fmt.Errorf("ring epoch %d has %d members: %d pipeline stages (train.pipeline_stages = %v) need at least %d, a member per stage; waiting for members to join",
			ep.Number, len(ep.Order), S, t.cfg.PipelineStages, S)
	}
	return pipeline.Assign(ep.Order, S)
}

// pipeFits reports whether ep can hold the pipelines, logging once per
// epoch why not.
func (t *Trainer) pipeFits(ep gossip.Epoch) bool {
	if t.stages == nil {
		return true
	}
	_, err := t.layoutOf(ep)
	if err != nil && ep.Number != t.pipeWaitLogged {
		t.log.Warn("training waits", zap.Error(err))
		t.pipeWaitLogged = ep.Number
	}
	return err == nil
}

// choosePipeState picks the state the members of a pipelined epoch
// continue from: the step most members past step 0 hold (ties: the
// higher), among those at which every stage has a holder; for each stage,
// the parameter hash most of its holders at that step announce (ties: the
// lower). With every member at step 0 it returns step 0 and no hashes
// (every stage starts from train.seed). An error says which stage has no
// holder.
func choosePipeState(order []string, steps map[string]uint64, hashes map[string]string, held map[string]int, stages int, limit uint64) (uint64, []string, error) {
	count := map[uint64]int{}
	for _, p := range order {
		if s := steps[p]; s > 0 && s <= limit {
			count[s]++
		}
	}
	if len(count) == 0 {
		return 0, nil, nil
	}
	cands := make([]uint64, 0, len(count))
	for s := range count {
		cands = append(cands, s)
	}
	slices.SortFunc(cands, func(a, b uint64) int {
		if count[a] != count[b] {
			return count[b] - count[a]
		}
		if a > b {
			return -1
		}
		return 1
	})
	missing := -1
	for _, step := range cands {
		want := make([]string, stages)
		ok := true
		for s := range stages {
			votes := map[string]int{}
			for _, p := range order {
				if steps[p] == step && held[p] == s {
					votes[hashes[p]]++
				}
			}
			best, n := "", 0
			for h, c := range votes {
				if c > n || (c == n && h < best) {
					best, n = h, c
				}
			}
			if n == 0 {
				if missing < 0 { // of the best candidate, for the error
					missing = s
				}
				ok = false
				break
			}
			want[s] = best
		}
		if ok {
			return step, want, nil
		}
	}
	return 0, nil, fmt.Errorf("train: no step at which every pipeline stage has a holder (stage %d has none at step %d): its state is lost with the members that held it; restart the run or bring one back",
		missing, cands[0])
}

// enterStage brings this peer to its stage of ep's layout at the state
// the members continue from (choosePipeState), fetching it from a holder
// when this peer lacks it, and sets the pipeline's shard of the batch.
func (t *Trainer) enterStage(ctx context.Context, ep gossip.Epoch, steps map[string]uint64, hashes map[string]string, held map[string]int) error {
	as, err := t.layoutOf(ep)
	if err != nil {
		return err
	}
	s, r, ok := as.Place(t.self)
	if !ok && slices.Contains(as.Idle, t.self) {
		return t.enterIdle(ctx, ep, as, steps, hashes, held)
	}
	if !ok {
		return fmt.Errorf("train: %s has no place in ring epoch %d's layout %v", t.self, ep.Number, as)
	}
	B := t.cfg.BatchSize
	t.shard = Shard{Offset: r * B, Size: B, Global: as.Replicas * B, FirstDevice: r, Weight: 1}
	target, want, err := choosePipeState(ep.Order, steps, hashes, held, as.Stages, uint64(t.cfg.Steps))
	if err != nil {
		return t.settleUnsettled(ctx, ep, steps, held, err)
	}
	t.mu.Lock()
	force := t.forceSync
	t.forceSync = false
	t.mu.Unlock()
	members := as.StageMembers(s)
	if leader := members[0]; force && leader != t.self && steps[leader] == target && held[leader] == s {
		want[s] = hashes[leader] // this peer's check differed from its stage leader's
	}
	if target == 0 {
		if t.stages.Stage() == s {
			return nil
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.switchStage(s, nil, 0)
	}
	if t.stages.Stage() == s && t.step == target && hashes[t.self] == want[s] {
		return nil
	}
	// Fetch it from a replica of the stage that keeps it, else from any
	// holder (one that moves to another stage serves its old one).
	src := ""
	for _, p := range slices.Concat(members, ep.Order) {
		if p != t.self && steps[p] == target && held[p] == s && hashes[p] == want[s] {
			src = p
			break
		}
	}
	if src == "" {
		return fmt.Errorf("train: no member holds stage %d at step %d", s, target)
	}
	if t.stages.Stage() != s {
		t.log.Info("the layout moves this peer to another pipeline stage", zap.Uint64("epoch", ep.Number),
			zap.Int("from_stage", t.stages.Stage()), zap.Int("to_stage", s), zap.String("layout", as.String()))
	}
	t.wantStage = s
	return t.syncFrom(ctx, src, target, want[s])
}

// switchStage makes the learner hold stage s with state c (nil: the
// initial one) at step, keeping the old stage's state to serve, and
// rebuilds the codecs for the new stage's buckets. The caller holds t.mu.
func (t *Trainer) switchStage(s int, c *model.Checkpoint, step uint64) error {
	old := t.stages.Stage()
	var keep *heldState
	if t.step > 0 {
		st, err := t.l.State(t.step)
		if err != nil {
			return err
		}
		st.ConfigHash = t.stateHash(old)
		keep = &heldState{stage: old, step: t.step, state: st.Marshal()}
	}
	if err := t.stages.SetStage(s, c); err != nil {
		return err
	}
	t.prevState = keep
	t.step, t.hash, t.saved = step, "", 0
	t.status.Step = step
	clear(t.checks)
	if err := t.buildCodecs(); err != nil {
		return err
	}
	_, err := t.paramHash(context.Background())
	return err
}

// servePipeState answers a state request from peer from in pipelined
// mode: the held stage's state when from's place in this peer's epoch is
// that stage (or from is idle in it: it asks for the stage it holds), the
// stage this peer left when it is that one.
func (t *Trainer) servePipeState(from string, step uint64, ep gossip.Epoch) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stages == nil {
		return nil, fmt.Errorf("%w: holds no pipeline stage now", statesync.ErrUnavailable)
	}
	as, err := t.layoutOf(ep)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", statesync.ErrUnavailable, err)
	}
	s, _, ok := as.Place(from)
	if !ok && slices.Contains(as.Idle, from) {
		s, ok = t.stages.Stage(), true
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s has no stage in ring epoch %d", statesync.ErrRefused, from, ep.Number)
	}
	if p := t.prevState; p != nil && p.stage == s && p.step == step && t.stages.Stage() != s {
		return p.state, nil
	}
	if t.stages.Stage() != s || t.step != step {
		return nil, fmt.Errorf("%w: holds stage %d at step %d", statesync.ErrUnavailable, t.stages.Stage(), t.step)
	}
	c, err := t.l.State(step)
	if err != nil {
		return nil, err
	}
	c.ConfigHash = t.stateHash(s)
	return c.Marshal(), nil
}

// pipeEpoch is what a pipelined peer runs in one ring epoch.
type pipeEpoch struct {
	stage int
	tr    *pipestream.Transport
	// sent is the transport's byte count at the last step's start.
	sent uint64
	// act and grad are the codecs the stage's links carried in the last
	// step logged (train.activation_link_codecs = "auto").
	act, grad string
}

// noteLinkCodecs logs the codecs the stage's links carried in step when
// they differ from the last step's, under train.activation_link_codecs =
// "auto".
func (t *Trainer) noteLinkCodecs(pe *pipeEpoch, step uint64) {
	act, grad := t.stages.LinkCodecs()
	if t.cfg.ActivationLinkCodecs != config.ActivationLinkCodecsAuto || (act == pe.act && grad == pe.grad) {
		return
	}
	pe.act, pe.grad = act, grad
	in, out := t.stages.LinkRates()
	t.log.Info("pipeline link codecs", zap.Uint64("step", step), zap.Int("stage", pe.stage),
		zap.String("activations_to_next", act), zap.String("gradients_to_previous", grad),
		zap.Float64("next_mbit_s", out*8/1e6), zap.Float64("previous_mbit_s", in*8/1e6))
}

// beginPipe opens ep's pipeline transport for this peer's stage, starts
// the learner's stage runner on it, and returns the all-reduce spec of the
// ring of the stage's replicas.
func (t *Trainer) beginPipe(ep gossip.Epoch) (plan.EpochSpec, *pipeEpoch, error) {
	as, err := t.layoutOf(ep)
	if err != nil {
		return plan.EpochSpec{}, nil, err
	}
	s, r, ok := as.Place(t.self)
	if !ok || s != t.stages.Stage() {
		return plan.EpochSpec{}, nil, fmt.Errorf("train: holds stage %d, but ring epoch %d's layout %v places it at %d", t.stages.Stage(), ep.Number, as, s)
	}
	opener, ok := t.c.(PipeOpener)
	if !ok {
		return plan.EpochSpec{}, nil, errors.New("train: this peer cannot carry pipeline messages (its Cluster has no OpenPipe)")
	}
	maxPayload, tied, err := t.stages.Bounds()
	if err != nil {
		return plan.EpochSpec{}, nil, err
	}
	// A stage waits for its neighbour's messages for up to a step of the
	// neighbour's (compute, its ring, the tied exchange): the deadline is
	// generous, and a dead neighbour is noticed by its link first.
	timeout := max(t.cfg.ReadyTimeout.D(), 4*t.slowestStep)
	tr, err := opener.OpenPipe(pipestream.Pipe{Epoch: ep.Number, Digest: ep.Digest(), Peers: as.Pipelines[r], Self: t.self,
		Micro: t.cfg.MicroBatches, Codec: t.stages.WireCodec(), MaxPayload: maxPayload, TiedBytes: tied, EvalChunks: t.stages.EvalChunks(), Step: t.step, Timeout: timeout})
	if err != nil {
		return plan.EpochSpec{}, nil, err
	}
	h := fnv.New64a()
	h.Write([]byte(t.self))
	peers := as.Pipelines[r]
	rates := func() (float64, float64) { return neighbourRates(t.c.LinkMatrix(peers), s) }
	if err := t.stages.Begin(tr, h.Sum64(), rates); err != nil {
		tr.Reset(err)
		return plan.EpochSpec{}, nil, err
	}
	members := as.StageMembers(s)
	sub := gossip.Epoch{Number: ep.Number, Order: members, Coordinator: members[0]}
	spec := plan.NewEpochSpec(sub, t.self, t.arCfg.Session(t.log.Named("allreduce")), t.arCfg.Codec, t.c.LinkMatrix(members))
	// The stage rings of one epoch share its number: the digest tells them
	// apart, and from the rings of another epoch under the same number.
	spec.Ring.Digest = fmt.Sprintf("%s/stage%d", ep.Digest(), s)
	t.log.Info("pipeline stage in ring epoch", zap.Uint64("epoch", ep.Number), zap.String("layout", as.String()),
		zap.Int("stage", s), zap.Int("replica", r), zap.Ints("layers", []int{t.stages.Split()[s], t.stages.Split()[s+1]}),
		zap.Strings("stage_ring", members), zap.String("activation_codecs", t.stages.WireCodec()))
	return spec, &pipeEpoch{stage: s, tr: tr, sent: tr.Sent()}, nil
}

// endPipe ends the epoch's pipeline: gracefully, or with a reset that
// fails the neighbours' waits at once after a failed step.
func (t *Trainer) endPipe(pe *pipeEpoch, failed error) {
	t.stages.End()
	if failed != nil {
		pe.tr.Reset(failed)
		return
	}
	if err := pe.tr.Close(); err != nil {
		t.log.Debug("closing the pipeline transport", zap.Error(err))
	}
}

// stageLeader returns the first replica of this peer's stage in ep's
// layout, whose parameter hash the stage's other replicas compare theirs
// with (the stages differ from each other), and the stage.
func (t *Trainer) stageLeader(ep gossip.Epoch) (string, int, bool) {
	as, err := t.layoutOf(ep)
	if err != nil {
		return "", 0, false
	}
	s, _, ok := as.Place(t.self)
	if !ok {
		return "", 0, false
	}
	return as.StageMembers(s)[0], s, true
}

// neighbourRates returns the measured rates in bytes/s from stage s to
// the stages before and after it, in m, the link matrix of a pipeline's
// members in stage order (0: no such stage, or not measured).
func neighbourRates(m plan.Matrix, s int) (in, out float64) {
	return m.At(s, s-1), m.At(s, s+1)
}

// noteStepTime remembers the slowest step, for the pipeline's deadlines.
func (t *Trainer) noteStepTime(d time.Duration) { t.slowestStep = max(t.slowestStep, d) }
