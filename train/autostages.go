package train

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/compress/codecbench"
	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/internal/ctxutil"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/pipeline"
	"github.com/p2ptrain/p2ptrain/plan"
)

// This file is train.pipeline_stages = "auto" (docs/pipeline.md). Every
// peer starts with the whole model and times its layers. In the first ring
// epoch in which training starts, its coordinator projects pure data
// parallelism and every hybrid layout (pipeline.Setup.Plan; with S not
// dividing the members, the last members idle, ranked by time per sample
// since each member that trains adds train.batch_size) from its layer
// times, the slowest measured link between neighbours of the ring,
// the model's sizes, the global batch, the micro-batches and the codecs,
// and announces the fastest layout's number of stages and cut of the
// layers in its heartbeat payload, stamped with the epoch. The other
// members wait for that announcement and adopt it; later coordinators
// keep the choice the members hold, and confirm it in each epoch, except
// that a cluster of data parallelism is re-planned into a pipeline when
// one is projected replanGain faster (every member holds the whole model
// and cuts its own stage: recutLearner). A pipeline's choice holds for
// the run: changing it would need every stage's state gathered.

// StagesPlanner is a Cluster whose ring planner lays out pipelines once
// it knows their number of stages (node.Node): told when
// train.pipeline_stages = "auto" adopts a choice.
type StagesPlanner interface {
	SetPipelineStages(stages int)
}

// ComputeAnnouncer is a Cluster that tells the members this peer's
// measured compute per sample (node.Node): the ring planner leaves members
// far slower than the others idle where a pipeline layout leaves some idle
// (plan.SlowMembers), and "auto" projects each layout with the slowest
// member it trains with.
type ComputeAnnouncer interface {
	SetCompute(perSample time.Duration)
}

// StagesChoice is the number of pipeline stages a cluster trains with
// under train.pipeline_stages = "auto", and the cut of the model's layers
// into them, as the coordinator of a ring epoch chose or confirmed it.
type StagesChoice struct {
	// Stages is S (1: pure data parallelism).
	Stages int `json:"s"`
	// Split is the cut of the layers into the stages (S+1 boundaries; nil
	// for S = 1).
	Split []int `json:"split,omitempty"`
	// Epoch and Digest name the ring epoch whose coordinator announced
	// it (gossip.Epoch.Digest).
	Epoch  uint64 `json:"epoch"`
	Digest string `json:"digest"`
	// Holders and Step, for a re-plan, are the members that held the
	// state of step Step when the coordinator re-planned, in the order
	// that gives them their stages (holder i cuts stage i mod S),
	// whichever epoch each adopts the choice in: from data parallelism,
	// the whole model's state; from a pipeline, a stage's, which each
	// holder joins with the other stages' (fetched from their holders)
	// into the whole model's first.
	Holders []string `json:"holders,omitempty"`
	Step    uint64   `json:"step,omitempty"`
	// From, HolderStages and StageHashes describe a re-plan from a
	// pipeline: its cut of the layers, the stage each holder held, and
	// each stage's parameter hash at Step (nil from data parallelism).
	From         []int    `json:"from,omitempty"`
	HolderStages []int    `json:"holder_stages,omitempty"`
	StageHashes  []string `json:"stage_hashes,omitempty"`
}

// maxChoiceStages bounds a StagesChoice, as config bounds
// train.pipeline_stages; maxHolders its holders of a re-plan (the first
// ones of the epoch's order: the others fetch their stage).
const (
	maxChoiceStages = 256
	maxHolders      = 2 * maxChoiceStages
)

// check reports a choice no peer can have made (nil is none).
func (c *StagesChoice) check() error {
	if c == nil {
		return nil
	}
	switch {
	case c.Stages < 1 || c.Stages > maxChoiceStages:
		return fmt.Errorf("%d pipeline stages (want 1 to %d)", c.Stages, maxChoiceStages)
	case (c.Stages == 1) != (len(c.Split) == 0), c.Stages > 1 && len(c.Split) != c.Stages+1:
		return fmt.Errorf("%d pipeline stages cut at %v", c.Stages, c.Split)
	case len(c.Digest) > 64:
		return fmt.Errorf("an epoch digest of %d characters", len(c.Digest))
	case len(c.Holders) > maxHolders || (len(c.Holders) > 0 && ((c.Stages < 2 && len(c.From) == 0) || c.Step == 0)):
		return fmt.Errorf("%d pipeline stages re-planned at step %d with %d holders (at most %d)", c.Stages, c.Step, len(c.Holders), maxHolders)
	}
	for _, h := range c.Holders {
		if len(h) > 128 {
			return fmt.Errorf("a holder ID of %d characters", len(h))
		}
	}
	if err := checkCut(c.Split); err != nil {
		return err
	}
	if c.From == nil && c.HolderStages == nil && c.StageHashes == nil {
		return nil
	}
	from := len(c.From) - 1
	switch {
	case from < 2 || from > maxChoiceStages || len(c.Holders) == 0:
		return fmt.Errorf("a re-plan from %d pipeline stages (cut at %v) with %d holders", from, c.From, len(c.Holders))
	case len(c.HolderStages) != len(c.Holders) || len(c.StageHashes) != from:
		return fmt.Errorf("a re-plan from %d pipeline stages with %d holders: %d holders' stages and %d stage hashes", from, len(c.Holders), len(c.HolderStages), len(c.StageHashes))
	}
	for _, s := range c.HolderStages {
		if s < 0 || s >= from {
			return fmt.Errorf("a holder of stage %d in a re-plan from %d stages", s, from)
		}
	}
	for _, h := range c.StageHashes {
		if len(h) > 64 {
			return fmt.Errorf("a stage hash of %d characters", len(h))
		}
	}
	return checkCut(c.From)
}

// checkCut reports a cut of layers into stages that does not start at 0
// and increase.
func checkCut(cut []int) error {
	for i, b := range cut {
		if (i == 0 && b != 0) || (i > 0 && b <= cut[i-1]) {
			return fmt.Errorf("pipeline stages cut at %v: the cut must start at 0 and increase", cut)
		}
	}
	return nil
}

// key identifies the choice without the epoch that announced it.
func (c StagesChoice) key() string { return fmt.Sprint(c.Stages, c.Split) }

// String describes the choice for logs and errors.
func (c StagesChoice) String() string {
	if c.Stages == 1 {
		return "1 stage (pure data parallelism)"
	}
	parts := make([]string, 0, c.Stages)
	for s := range c.Stages {
		parts = append(parts, fmt.Sprintf("%d:%d", c.Split[s], c.Split[s+1]))
	}
	return fmt.Sprintf("%d stages (layers %s)", c.Stages, strings.Join(parts, " "))
}

// autoStages is a trainer's state under train.pipeline_stages = "auto".
type autoStages struct {
	// base is the [train] configuration as given: batch_size is each
	// member's share of the global batch, whatever the choice.
	base config.Train
	// train and test are the datasets the learners are built on (nil:
	// loaded from the configuration).
	train, test *data.Dataset
	// costs are this peer's per-sample layer costs (measured at start, or
	// Options.LayerCosts).
	costs []pipeline.LayerCost
	// cpu is what a step costs this peer's processor besides the layers,
	// and code each codec's coding seconds per value (measured with the
	// layers; zero and nil with Options.LayerCosts).
	cpu  pipeline.CPUCost
	code map[string]float64
	// measureWire is Options.MeasureWire.
	measureWire func(context.Context) (float64, float64, error)
	// choice is the choice this peer trains with (nil: none yet; the
	// learner is then the whole model, as for one stage).
	choice *StagesChoice
	// recutAt is the step at which this peer cut its whole model into a
	// stage of a re-planned choice (0: never).
	recutAt uint64
	// retryReplan asks for a new epoch once this one is entered, for a
	// re-plan deferred at step retryAt (replanStages).
	retryReplan bool
	retryAt     uint64
	// gathered is the stage this peer held when it joined a re-planned
	// pipeline's stages (gatherLearner; nil: none), under the trainer's mu.
	gathered *gatheredState
}

// The links assumed while none between neighbours of the ring is
// measured: a local network's.
const (
	defaultLinkMbit = 1000
	defaultLinkRTT  = time.Millisecond
)

// profileSamples bounds the batch the layers are timed on at start, and
// profileBudget the time spent timing (one pass more when a first one
// took less than a third of it).
const (
	profileSamples = 4
	profileBudget  = 3 * time.Second
)

// initAuto prepares train.pipeline_stages = "auto": the learner must be
// the whole model on one device (New builds it), and the settings the
// peers compare say "auto" rather than a number of stages.
func (t *Trainer) initAuto(o Options) error {
	if !t.cfg.PipelineStages.Auto() {
		return nil
	}
	ml, ok := t.l.(*ModelLearner)
	if !ok || len(ml.Devices()) != 1 {
		return fmt.Errorf("train: train.pipeline_stages = auto needs the built-in model on one device (got a %T on %d devices)", t.l, len(t.l.Devices()))
	}
	t.auto = &autoStages{base: t.cfg, train: o.Train, test: o.Test, costs: slices.Clone(o.LayerCosts), measureWire: o.MeasureWire}
	autoSettings(t.settings, t.cfg)
	t.payload.Settings = t.settings.cluster()
	return nil
}

// autoSettings adds to s, a whole model's settings, what the peers of
// train.pipeline_stages = "auto" must agree on before any choice: the
// pipeline's keys (train.pipeline_stages itself is in every trainer's
// settings, so an auto cluster and a fixed one refuse each other naming
// it).
func autoSettings(s Settings, cfg config.Train) {
	s["train.pipeline"] = fmt.Sprintf("auto, %d micro-batches, %s activations (link codecs %s), %s", cfg.MicroBatches, cfg.ActivationCodec,
		cfg.ActivationLinkCodecs, cfg.PipelineSchedule)
}

// measureLayers times the whole model's layers on this peer, and what a
// step costs its processor besides them (profileCPU), unless
// Options.LayerCosts gave the layers' costs, and announces the compute per
// sample (ComputeAnnouncer).
func (t *Trainer) measureLayers(ctx context.Context) error {
	a := t.auto
	if a == nil {
		return nil
	}
	if a.costs == nil {
		if err := t.timeLayers(ctx); err != nil {
			return err
		}
	}
	if ca, ok := t.c.(ComputeAnnouncer); ok {
		ca.SetCompute(time.Duration(perSample(a.costs) * float64(time.Second)))
	}
	return nil
}

// perSample returns the seconds per sample of costs' forward and backward passes.
func perSample(costs []pipeline.LayerCost) float64 {
	var sum float64
	for _, c := range costs {
		sum += c.Forward + c.Backward
	}
	return sum
}

// timeLayers is measureLayers' timing of the layers and the processor.
func (t *Trainer) timeLayers(ctx context.Context) error {
	a := t.auto
	ml, ok := t.l.(*ModelLearner)
	if !ok {
		return fmt.Errorf("train: timing the layers needs the whole model, the learner is a %T", t.l)
	}
	start := time.Now()
	costs, err := profileCosts(ml.Model(), t.cfg)
	if err != nil {
		return fmt.Errorf("train: train.pipeline_stages = auto: timing the layers: %w", err)
	}
	specs := []string{t.arCfg.Codec, t.cfg.ActivationCodec}
	if t.cfg.ActivationLinkCodecs == config.ActivationLinkCodecsAuto {
		ladder, err := pipeline.Ladder(t.cfg.ActivationCodec)
		if err != nil {
			return fmt.Errorf("train: train.activation_codec: %w", err)
		}
		specs = append(specs, ladder[:len(ladder)-1]...) // the last is train.activation_codec
	}
	cpu, code, err := profileCPU(ml.Model(), t.cfg, specs)
	if err != nil {
		return fmt.Errorf("train: train.pipeline_stages = auto: timing the processor's work besides the layers: %w", err)
	}
	if a.measureWire != nil {
		// A transport that cannot be timed (no loopback TCP, say) costs the
		// choice its per-message terms, not the run.
		wctx, cancel := context.WithTimeout(ctx, 10*profileBudget)
		cpu.Message, cpu.Byte, err = a.measureWire(wctx)
		cancel()
		if err != nil {
			cpu.Message, cpu.Byte = 0, 0
			t.log.Warn("train.pipeline_stages = auto: could not time the transport; the choice prices no processor time for messages", zap.Error(err))
		}
	}
	a.costs, a.cpu, a.code = costs, cpu, code
	sum := perSample(costs)
	t.log.Info("timed the layers for train.pipeline_stages = auto", zap.Int("layers", len(costs)),
		zap.Float64("ms_per_sample", sum*1e3), zap.Float64("update_ns_per_param", cpu.Update*1e9),
		zap.Float64("message_us", cpu.Message*1e6), zap.Float64("byte_ns", cpu.Byte*1e9), zap.Any("code_ns_per_value", scaled(code, 1e9)),
		zap.Duration("took", time.Since(start)))
	return nil
}

// Sizes of profileCPU's measurements: the optimizer steps cpuUpdateReps
// times; the codecs code cpuCodecValues values (a ring segment's order
// of size).
const (
	cpuUpdateReps  = 3
	cpuCodecValues = 1 << 20
)

// profileCPU measures what a step costs this peer's processor besides
// m's layers (pipeline.CPUCost, but the transport's figures): the step of
// cfg's optimizer and every codec of specs (the map: coding seconds per
// value, by canonical spec).
func profileCPU(m *model.Model, cfg config.Train, specs []string) (pipeline.CPUCost, map[string]float64, error) {
	update, err := model.TimeOptimizerStep(model.OptimConfig{Name: cfg.Optimizer, LR: cfg.LR, Momentum: cfg.Momentum, WeightDecay: cfg.WeightDecay},
		m, cpuUpdateReps)
	if err != nil {
		return pipeline.CPUCost{}, nil, fmt.Errorf("the optimizer: %w", err)
	}
	code, err := codecbench.CodingSeconds(specs, cpuCodecValues)
	if err != nil {
		return pipeline.CPUCost{}, nil, err
	}
	return pipeline.CPUCost{Update: update, Beside: !strings.HasPrefix(m.Devices()[0].Name(), "cpu")}, code, nil
}

// scaled returns m with every value times f, for logs.
func scaled(m map[string]float64, f float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = v * f
	}
	return out
}

// profileCosts times m's layers (model.ProfileLayers) on a random batch of
// at most profileSamples samples, within about profileBudget, and returns
// their per-sample costs.
func profileCosts(m *model.Model, cfg config.Train) ([]pipeline.LayerCost, error) {
	infos, err := model.Layers(cfg.Model, layerConfig(cfg))
	if err != nil {
		return nil, err
	}
	n := min(cfg.BatchSize, profileSamples)
	b := m.RandomBatch(n, cfg.Seed)
	start := time.Now()
	times, err := m.ProfileLayers(b, 1)
	if err == nil && time.Since(start) < profileBudget/3 {
		times, err = m.ProfileLayers(b, 3)
	}
	if err != nil {
		return nil, err
	}
	return pipeline.Costs(infos, times, n)
}

// layerConfig is the model configuration of cfg's layer list.
func layerConfig(cfg config.Train) model.Config {
	g := cfg.GPT
	return model.Config{Hidden: cfg.Hidden, MaxBatch: 1,
		GPT: model.GPTConfig{Layers: g.Layers, DModel: g.DModel, Heads: g.Heads, Context: g.Context, Vocab: g.Vocab}}
}

// linkSummary is what a choice assumes of the links: the slowest measured
// rate between neighbours of the ring (bytes/s, each way) and the longest
// measured round trip among them (seconds), or the defaults.
type linkSummary struct {
	Bandwidth, RTT float64
	// Measured counts the ring's edges with a measured rate, of Edges.
	Measured, Edges int
	// RTTMeasured says the RTT was measured rather than the default.
	RTTMeasured bool
}

// ringLinks summarises the links between neighbours of order (the ring's
// edges, both directions) from bw (bytes/s) and rtt (seconds) matrices of
// order, zero where nobody measured.
func ringLinks(order []string, bw, rtt plan.Matrix) linkSummary {
	P := len(order)
	s := linkSummary{Bandwidth: math.Inf(1)}
	at := func(m plan.Matrix, i, j int) float64 {
		if len(m) != P || len(m[i]) != P {
			return 0
		}
		return m[i][j]
	}
	for i := range P {
		j := (i + 1) % P
		if j == i || (P == 2 && i == 1) { // one peer: no edge; two: one
			continue
		}
		s.Edges++
		rate := math.Inf(1)
		for _, v := range []float64{at(bw, i, j), at(bw, j, i)} {
			if v > 0 && !math.IsInf(v, 0) {
				rate = min(rate, v)
			}
		}
		if !math.IsInf(rate, 1) {
			s.Bandwidth = min(s.Bandwidth, rate)
			s.Measured++
		}
		for _, v := range []float64{at(rtt, i, j), at(rtt, j, i)} {
			if v > 0 && !math.IsInf(v, 0) {
				s.RTT = max(s.RTT, v)
				s.RTTMeasured = true
			}
		}
	}
	if s.Measured == 0 {
		s.Bandwidth = defaultLinkMbit * 1e6 / 8
	}
	if !s.RTTMeasured {
		s.RTT = defaultLinkRTT.Seconds()
	}
	return s
}

// String describes the summary for logs.
func (s linkSummary) String() string {
	switch {
	case s.Edges == 0:
		return "no link (one member): the default"
	case s.Measured == 0:
		return fmt.Sprintf("none of the ring's %d links measured yet: the default %d Mbit/s, RTT %s", s.Edges, defaultLinkMbit, defaultLinkRTT)
	}
	return fmt.Sprintf("the slowest of %d measured ring links (of %d)", s.Measured, s.Edges)
}

// stagesInput is what a number of stages is chosen from.
type stagesInput struct {
	// Costs are the layers' per-sample costs.
	Costs []pipeline.LayerCost
	// Peers is the ring epoch's member count; Batch the global batch
	// (Peers × train.batch_size); Micro train.micro_batches.
	Peers, Batch, Micro int
	// PerPeerBatch is train.batch_size: each member that trains adds it to
	// the global batch, so that a layout with idle members takes fewer
	// samples (0: every layout takes Batch).
	PerPeerBatch int
	// Rates are the measured rates in bytes/s between the members, in the
	// epoch's order (nil: every layout runs on Links): a pipeline layout
	// is then projected on the links plan.PipelineOrder lays it out on.
	Rates plan.Matrix
	// Compute is the members' announced compute in seconds per sample, in
	// the epoch's order (plan.MemberCompute; nil: all compute as Costs
	// say): each layout is projected with the slowest member it trains
	// with (plan.TrainingCompute), and laid out as plan.PipelineOrder does.
	Compute []float64
	// Links are the links assumed.
	Links linkSummary
	// Schedule is train.pipeline_schedule; Grad and Act allreduce.codec
	// and train.activation_codec; ActLinks says that
	// train.activation_link_codecs is "auto".
	Schedule  pipeline.Schedule
	Grad, Act string
	ActLinks  bool
	// CPU is what a step costs a peer's processor besides the layers, and
	// Code each codec's coding seconds per value by canonical spec.
	CPU  pipeline.CPUCost
	Code map[string]float64
}

// layoutLinks returns pipeline.Setup.LayoutLinks over the measured rates
// bw between the members (and their compute, as plan.MemberCompute): for
// S stages, each hop's slowest measured link and the stages' rings'
// slowest measured edge in the layout plan.PipelineOrder makes of them (as
// the ring planner does once it knows S), 0 where none is measured.
func layoutLinks(bw plan.Matrix, compute []float64) func(stages int) ([]float64, float64) {
	planning := plan.Planning(bw)
	return func(stages int) ([]float64, float64) {
		return plan.LayoutRates(bw, plan.PipelineOrder(planning, stages, compute), stages)
	}
}

// slowdown returns pipeline.Setup.Slowdown for members of compute (seconds
// per sample) against own, this peer's figure for the layer costs: the
// slowest member each layout trains with (plan.TrainingCompute), relative
// to own; nil when no member announced its compute.
func slowdown(compute []float64, own float64) func(stages int) float64 {
	if compute == nil || !(own > 0) {
		return nil
	}
	return func(stages int) float64 { return plan.TrainingCompute(compute, stages) / own }
}

// planStages chooses the number of stages and the cut of the layers: the
// fastest layout of pipeline.Setup.Plan, with the gradient and activation
// codecs configured. It returns the projected layouts too, fastest first.
func planStages(in stagesInput) (StagesChoice, []pipeline.Layout, error) {
	grad, err := pipeline.CodecCostOf(in.Grad)
	if err != nil {
		return StagesChoice{}, nil, fmt.Errorf("allreduce.codec: %w", err)
	}
	act, err := pipeline.CodecCostOf(in.Act)
	if err != nil {
		return StagesChoice{}, nil, fmt.Errorf("train.activation_codec: %w", err)
	}
	grad.Code, act.Code = in.Code[grad.Spec], in.Code[act.Spec]
	if in.ActLinks {
		if act, err = pipeline.WithLadder(act, in.Code); err != nil {
			return StagesChoice{}, nil, fmt.Errorf("train.activation_codec: %w", err)
		}
	}
	setup := pipeline.Setup{Layers: in.Costs, Peers: in.Peers, Batch: in.Batch, Micro: in.Micro,
		Bandwidth: in.Links.Bandwidth, RTT: in.Links.RTT, Schedule: in.Schedule, CPU: in.CPU,
		Idle: in.PerPeerBatch > 0, PerPeerBatch: in.PerPeerBatch}
	if in.Rates != nil {
		setup.LayoutLinks = layoutLinks(in.Rates, in.Compute)
	}
	setup.Slowdown = slowdown(in.Compute, perSample(in.Costs))
	layouts, err := setup.Plan([]pipeline.CodecCost{grad}, []pipeline.CodecCost{act})
	if err != nil {
		return StagesChoice{}, nil, err
	}
	best := layouts[0]
	c := StagesChoice{Stages: best.Stages}
	if best.Stages > 1 {
		c.Split = slices.Clone([]int(best.Split))
	}
	return c, layouts, nil
}

// settleStages brings this peer to the choice of stages of ep's
// coordinator, after every member announced itself ready in ep: the
// coordinator keeps the choice most members hold, or makes it when none
// holds one (chooseStages), and announces it stamped with ep; the others
// wait for that announcement (at most train.ready_timeout) and adopt it.
func (t *Trainer) settleStages(ctx context.Context, ep gossip.Epoch) error {
	if ep.Coordinator == t.self {
		c, err := t.chooseStages(ctx, ep)
		if err != nil {
			return err
		}
		return t.adoptStages(ctx, c, ep)
	}
	deadline := time.Now().Add(t.cfg.ReadyTimeout.D())
	for {
		members, cur := t.c.View()
		if !sameEpoch(cur, ep) {
			return errEpochChanged
		}
		for _, m := range members {
			if c := payloadOf(m).Stages; m.PeerID == ep.Coordinator && c != nil && c.Epoch == ep.Number && c.Digest == ep.Digest() {
				return t.adoptStages(ctx, *c, ep)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("train: the coordinator %s of ring epoch %d announced no choice of train.pipeline_stages = auto within train.ready_timeout (%s)",
				ep.Coordinator, ep.Number, t.cfg.ReadyTimeout.D())
		}
		if !ctxutil.Sleep(ctx, pollInterval) {
			return ctx.Err()
		}
	}
}

// awaitChoice waits (at most train.ready_timeout) until every member of
// ep announces the choice of stages this peer settled on in ep. A member
// that changes its choice in ep, such as a holder of a re-plan, leaves ep
// for a new epoch, and its Ready, which names a state of its old choice,
// must not be taken for a state of the new one (a member holding the
// whole model would otherwise fetch a stage's state from it, or the
// reverse); a member that keeps its choice announces it before it
// enters ep's training.
func (t *Trainer) awaitChoice(ctx context.Context, ep gossip.Epoch) error {
	want := t.auto.choice.key()
	deadline := time.Now().Add(t.cfg.ReadyTimeout.D())
	for {
		members, cur := t.c.View()
		if !sameEpoch(cur, ep) {
			return errEpochChanged
		}
		var other []string
		for _, m := range members {
			if c := payloadOf(m).Stages; m.PeerID != t.self && slices.Contains(ep.Order, m.PeerID) && (c == nil || c.key() != want) {
				other = append(other, m.PeerID)
			}
		}
		if len(other) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("train: members %s did not take %s, the choice of train.pipeline_stages = auto in ring epoch %d, within train.ready_timeout (%s)",
				strings.Join(other, ", "), t.auto.choice, ep.Number, t.cfg.ReadyTimeout.D())
		}
		if !ctxutil.Sleep(ctx, pollInterval) {
			return ctx.Err()
		}
	}
}

// chooseStages is the coordinator's choice in ep: the choice most members
// of ep hold (ties: this peer's own, then the fewer stages), or, when none
// holds one, the fastest projected layout (planStages), logged with the
// projection.
func (t *Trainer) chooseStages(ctx context.Context, ep gossip.Epoch) (StagesChoice, error) {
	a := t.auto
	members, _ := t.c.View()
	votes, byKey, newest := map[string]int{}, map[string]StagesChoice{}, map[string]uint64{}
	vote := func(c *StagesChoice) {
		if c != nil {
			votes[c.key()]++
			if c.Epoch >= newest[c.key()] {
				byKey[c.key()], newest[c.key()] = *c, c.Epoch
			}
		}
	}
	vote(a.choice)
	for _, m := range members {
		if m.PeerID != t.self && slices.Contains(ep.Order, m.PeerID) {
			vote(payloadOf(m).Stages)
		}
	}
	if len(votes) > 0 {
		keys := make([]string, 0, len(votes))
		for k := range votes {
			keys = append(keys, k)
		}
		own := ""
		if a.choice != nil {
			own = a.choice.key()
		}
		// Ties go to the newest announcement (a re-plan that not every
		// member adopted before its epoch ended), then to this peer's own.
		slices.SortFunc(keys, func(x, y string) int {
			return cmp.Or(votes[y]-votes[x], cmp.Compare(newest[y], newest[x]), boolOrder(y == own, x == own), byKey[x].Stages-byKey[y].Stages, strings.Compare(x, y))
		})
		c := byKey[keys[0]]
		if keys[0] != own {
			t.log.Info("train.pipeline_stages = auto: taking the choice most members hold", zap.Uint64("epoch", ep.Number),
				zap.String("choice", c.String()), zap.Int("holders", votes[keys[0]]), zap.Int("members", len(ep.Order)))
		}
		if len(votes) == 1 {
			if r, ok := t.replanStages(ep, c); ok {
				return r, nil
			}
		}
		return c, nil
	}
	links := t.waitLinks(ctx, ep)
	members, _ = t.c.View() // fresher: its links were awaited
	in := stagesInput{Rates: t.c.LinkMatrix(ep.Order), Compute: plan.MemberCompute(ep.Order, members), Costs: a.costs, Peers: len(ep.Order), Batch: len(ep.Order) * a.base.BatchSize, PerPeerBatch: a.base.BatchSize, Micro: a.base.MicroBatches,
		Links: links, Grad: t.arCfg.Codec, Act: a.base.ActivationCodec, ActLinks: a.base.ActivationLinkCodecs == config.ActivationLinkCodecsAuto,
		CPU: a.cpu, Code: a.code}
	var err error
	if in.Schedule, err = pipeline.ParseSchedule(a.base.PipelineSchedule); err != nil {
		return StagesChoice{}, fmt.Errorf("train: train.pipeline_schedule: %w", err)
	}
	c, layouts, err := planStages(in)
	if err != nil {
		return StagesChoice{}, fmt.Errorf("train: choosing train.pipeline_stages = auto: %w", err)
	}
	t.logChoice(ep, in, c, layouts)
	return c, nil
}

// replanGain is how much faster per sample the projection must find a
// pipeline than the data parallelism a cluster trains with before its
// coordinator re-plans (every member then cuts its whole model, and the
// layout moves members between stages).
const replanGain = 1.25

// replanStages is the coordinator's re-plan of a cluster whose members
// all hold the choice cur under "auto": with the layer costs, the members
// of ep and their ring's links all measured, it projects every layout
// again, as for a first choice, and returns the fastest when it differs
// from cur and is at least replanGain faster per sample than cur's layout
// projected on the same inputs. From data parallelism every member holds
// the whole model and cuts its own state into its stage (recutLearner);
// from a pipeline each holder of a stage joins the stages' states, fetched
// from their holders, into the whole model's first (gatherLearner).
// Nothing else is transferred but the stages a new layout moves members to.
func (t *Trainer) replanStages(ep gossip.Epoch, cur StagesChoice) (StagesChoice, bool) {
	a := t.auto
	if len(a.costs) == 0 || len(ep.Order) < 2 {
		return StagesChoice{}, false
	}
	if _, ok := t.c.(StageStates); cur.Stages > 1 && !ok {
		return StagesChoice{}, false // the stages' states cannot be gathered
	}
	members, _ := t.c.View()
	rtt, _ := plan.RTTMatrix(ep.Order, plan.LinkRows(members))
	bw := t.c.LinkMatrix(ep.Order)
	links := ringLinks(ep.Order, bw, rtt)
	if links.Measured < links.Edges {
		return StagesChoice{}, false // re-planned once they are
	}
	in := stagesInput{Rates: bw, Compute: plan.MemberCompute(ep.Order, members), Costs: a.costs, Peers: len(ep.Order), Batch: len(ep.Order) * a.base.BatchSize, PerPeerBatch: a.base.BatchSize,
		Micro: a.base.MicroBatches, Links: links, Grad: t.arCfg.Codec, Act: a.base.ActivationCodec,
		ActLinks: a.base.ActivationLinkCodecs == config.ActivationLinkCodecsAuto, CPU: a.cpu, Code: a.code}
	var err error
	if in.Schedule, err = pipeline.ParseSchedule(a.base.PipelineSchedule); err != nil {
		return StagesChoice{}, false
	}
	c, layouts, err := planStages(in)
	if err != nil || c.key() == cur.key() {
		return StagesChoice{}, false
	}
	// cur's layout as projected: its cut, else the fastest of its S.
	now := slices.IndexFunc(layouts, func(l pipeline.Layout) bool { return l.Stages == cur.Stages && slices.Equal(l.Split, cur.Split) })
	if now < 0 {
		now = slices.IndexFunc(layouts, func(l pipeline.Layout) bool { return l.Stages == cur.Stages })
	}
	perSample := func(l pipeline.Layout) float64 { return l.Step / float64(l.Batch) }
	if now < 0 || perSample(layouts[now]) < replanGain*perSample(layouts[0]) {
		return StagesChoice{}, false
	}
	var holders []string
	var step uint64
	if cur.Stages == 1 {
		holders, step = t.wholeHolders(ep)
	} else {
		holders, step = t.stageHolders(ep, cur, &c)
	}
	if step >= uint64(t.cfg.Steps) {
		return StagesChoice{}, false // the run is over: its last epochs only share the final state
	}
	if len(holders) < c.Stages || len(holders) == 0 {
		// A stage without a member holding its state would be lost: once
		// this epoch's sync has brought every member to the state, a new
		// epoch re-plans (once per step).
		if a.retryAt != step {
			a.retryAt, a.retryReplan = step, true
			t.log.Info("train.pipeline_stages = auto: re-planning in a new epoch, once every member holds step "+strconv.FormatUint(step, 10),
				zap.Uint64("epoch", ep.Number), zap.Int("holders", len(holders)), zap.String("choice", c.String()))
		}
		return StagesChoice{}, false
	}
	n := min(len(holders), maxHolders)
	c.Holders, c.Step = holders[:n], step
	if c.HolderStages != nil {
		c.HolderStages = c.HolderStages[:n]
	}
	if !fitHolders(&c, t.payload) {
		t.log.Warn("train.pipeline_stages = auto: not re-planning: the announcement of "+c.String()+" does not fit a heartbeat", zap.Uint64("epoch", ep.Number),
			zap.Int("holders", len(c.Holders)), zap.Int("max_app_bytes", gossip.MaxAppBytes))
		return StagesChoice{}, false
	}
	t.log.Info("train.pipeline_stages = auto: re-planning from "+cur.String(), zap.Uint64("epoch", ep.Number), zap.Uint64("step", c.Step),
		zap.String("choice", c.String()), zap.Float64("gain_per_sample", perSample(layouts[now])/perSample(layouts[0])),
		zap.Strings("holders", c.Holders))
	t.logChoice(ep, in, c, layouts)
	return c, true
}

// fitHolders trims c's holders from the end of the list until base's
// payload with c fits a heartbeat (gossip.MaxAppBytes; a larger one every
// member would refuse), keeping at least c.Stages holders and, from a
// pipeline, a holder of every stage. It reports false when even those do
// not fit.
func fitHolders(c *StagesChoice, base Payload) bool {
	for {
		p, cc := base, *c
		p.Stages = &cc
		if len(p.Encode()) <= gossip.MaxAppBytes {
			return true
		}
		if !dropHolder(c) {
			return false
		}
	}
}

// dropHolder removes c's last holder whose removal leaves at least
// c.Stages holders and, from a pipeline, a holder of every stage; false
// when none can go.
func dropHolder(c *StagesChoice) bool {
	if len(c.Holders) <= c.Stages {
		return false
	}
	for i := len(c.Holders) - 1; i >= 0; i-- {
		if c.HolderStages != nil {
			if slices.Index(c.HolderStages, c.HolderStages[i]) == i {
				continue // the stage's first holder, which stays
			}
			c.HolderStages = slices.Delete(slices.Clone(c.HolderStages), i, i+1)
		}
		c.Holders = slices.Delete(slices.Clone(c.Holders), i, i+1)
		return true
	}
	return false
}

// stageHolders returns the members of ep, in its order, that announced
// in ep a stage of cur's pipeline at the state the epoch continues from
// (choosePipeState over the members' Ready), and that step; it sets c's
// From (cur's cut), HolderStages and StageHashes for them. None when a
// stage has no holder there.
func (t *Trainer) stageHolders(ep gossip.Epoch, cur StagesChoice, c *StagesChoice) ([]string, uint64) {
	members, _ := t.c.View()
	steps, hashes, held := t.readyIn(ep, members)
	target, want, err := choosePipeState(ep.Order, steps, hashes, held, cur.Stages, uint64(t.cfg.Steps))
	if err != nil || target == 0 {
		return nil, target
	}
	var out []string
	var stages []int
	for _, p := range ep.Order {
		if steps[p] == target && held[p] < cur.Stages && hashes[p] == want[held[p]] {
			out, stages = append(out, p), append(stages, held[p])
		}
	}
	c.From, c.HolderStages, c.StageHashes = slices.Clone(cur.Split), stages, want
	return out, target
}

// wholeHolders returns the members of ep, in its order, that announced
// in ep the state of data parallelism the epoch continues from
// (chooseState over the members' Ready: the step most members past 0
// hold), and that step: the holders of the whole model's state a re-plan
// cuts. A member behind, or a joiner, syncs to that state in the epoch
// and holds it in the next.
func (t *Trainer) wholeHolders(ep gossip.Epoch) ([]string, uint64) {
	members, _ := t.c.View()
	steps, hashes := map[string]uint64{}, map[string]string{}
	for _, m := range members {
		if r := payloadOf(m).Ready; m.PeerID != t.self && r.In(ep) && r.Stage == 0 {
			steps[m.PeerID], hashes[m.PeerID] = r.Step, r.Hash
		}
	}
	steps[t.self] = t.step
	if r := t.payload.Ready; r != nil {
		hashes[t.self] = r.Hash
	}
	target, want := chooseState(ep.Order, steps, hashes, uint64(t.cfg.Steps))
	if target == 0 {
		return nil, 0
	}
	var out []string
	for _, p := range ep.Order {
		if steps[p] == target && hashes[p] == want {
			out = append(out, p)
		}
	}
	return out, target
}

// afterEnter ends this peer's entry into a ring epoch: when it
// coordinates the epoch and deferred a re-plan because too few members
// held its state (replanStages), every member holds it now, and it asks
// for a new epoch to re-plan in.
func (t *Trainer) afterEnter(ep gossip.Epoch) error {
	if a := t.auto; a != nil && a.retryReplan {
		a.retryReplan = false
		return fmt.Errorf("train: every member of ring epoch %d holds step %d now; entering a new ring epoch to re-plan the layout", ep.Number, t.step)
	}
	return nil
}

// boolOrder orders true before false.
func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// waitLinks summarises the links between neighbours of ep's ring, waiting
// up to half of train.ready_timeout for every one of them to be measured
// (the probes of a new cluster take a few seconds).
func (t *Trainer) waitLinks(ctx context.Context, ep gossip.Epoch) linkSummary {
	deadline := time.Now().Add(t.cfg.ReadyTimeout.D() / 2)
	for {
		members, cur := t.c.View()
		rtt, _ := plan.RTTMatrix(ep.Order, plan.LinkRows(members))
		s := ringLinks(ep.Order, t.c.LinkMatrix(ep.Order), rtt)
		if s.Measured == s.Edges || time.Now().After(deadline) || !sameEpoch(cur, ep) || !ctxutil.Sleep(ctx, pollInterval) {
			return s
		}
	}
}

// logChoice logs the choice and the projection behind it, one line per
// candidate layout, fastest first.
func (t *Trainer) logChoice(ep gossip.Epoch, in stagesInput, c StagesChoice, layouts []pipeline.Layout) {
	t.log.Info("train.pipeline_stages = auto: chose "+c.String(), zap.Uint64("epoch", ep.Number), zap.Int("peers", in.Peers),
		zap.Int("global_batch", in.Batch), zap.Int("micro_batches", in.Micro), zap.String("grad_codec", in.Grad), zap.String("act_codec", in.Act),
		zap.Float64("link_mbit_s", in.Links.Bandwidth*8/1e6), zap.Float64("rtt_ms", in.Links.RTT*1e3), zap.String("links", in.Links.String()),
		zap.Float64("projected_step_s", layouts[0].Step))
	for i, l := range layouts {
		t.log.Info("projected layout", zap.Int("rank", i+1), zap.String("layout", l.Name()), zap.Ints("split", l.Split),
			zap.Float64("step_s", l.Step), zap.Float64("compute_s", l.Compute), zap.Float64("bubble", l.Bubble),
			zap.Float64("allreduce_s", l.AllReduce), zap.Float64("tied_s", l.Tied), zap.Float64("update_s", l.Update),
			zap.Float64("comm_cpu_s", l.CommCPU), zap.Float64("sent_mb_per_peer", l.PeerBytes/1e6),
			zap.Float64("hop_mbit_s", l.HopRate*8/1e6), zap.Float64s("hops_mbit_s", mbits(l.HopRates)), zap.Float64("ring_mbit_s", l.RingRate*8/1e6),
			zap.Int("params_per_peer", l.PeerParams))
	}
}

// mbits returns rates in bytes/s as Mbit/s, for logs.
func mbits(rates []float64) []float64 {
	out := make([]float64, len(rates))
	for i, r := range rates {
		out[i] = r * 8 / 1e6
	}
	return out
}

// adoptStages makes this peer train with choice c, announced in ep: it
// rebuilds the learner when c differs from the choice it holds (the whole
// model for one stage, else stage 0 of c's cut, at step 0), and
// announces c. A peer that discards the state of a step past 0 returns an
// error: its Ready in ep announced that state, so it enters a new epoch.
func (t *Trainer) adoptStages(ctx context.Context, c StagesChoice, ep gossip.Epoch) error {
	a := t.auto
	c.Split = slices.Clone(c.Split)
	c.Epoch, c.Digest = ep.Number, ep.Digest()
	first := a.choice == nil
	changed := (first && c.Stages != 1) || (!first && a.choice.key() != c.key())
	held := t.step
	// A re-plan from data parallelism: this peer holds the whole model's
	// state and cuts it into its stage instead of discarding it.
	recut := changed && !first && a.choice.Stages == 1 && c.Stages > 1 && held > 0 && held == c.Step && slices.Contains(c.Holders, t.self)
	// A re-plan from a pipeline: this peer holds a stage's state, joins it
	// with the others' into the whole model's and trains the new choice
	// from that.
	gather := changed && !first && a.choice.Stages > 1 && len(c.From) > 0 && held > 0 && held == c.Step &&
		slices.Contains(c.Holders, t.self) && slices.Equal(c.From, a.choice.Split)
	switch {
	case recut:
		if err := t.recutLearner(c, ep); err != nil {
			return err
		}
	case gather:
		if err := t.gatherLearner(ctx, c); err != nil {
			return err
		}
	case changed:
		if err := t.switchLearner(c); err != nil {
			return err
		}
	}
	if first || changed {
		t.mu.Lock()
		t.cfg.BatchSize = c.Stages * a.base.BatchSize // a pipeline of S members takes S shares
		base := t.settings.resumeHash()
		t.cfgHash = model.ConfigHash(hex.EncodeToString(base[:]), "stages", c.key())
		t.mu.Unlock()
		fields := []zap.Field{zap.Uint64("epoch", ep.Number), zap.String("coordinator", ep.Coordinator), zap.Int("stages", c.Stages), zap.Ints("split", c.Split)}
		switch {
		case first:
			t.log.Info("train.pipeline_stages = auto: training with "+c.String(), fields...)
		case recut:
			t.log.Info("train.pipeline_stages = auto: cut this peer's whole model into its stage of "+c.String(),
				append(fields, zap.Uint64("step", held), zap.Int("stage", t.heldStage()))...)
		case gather:
			t.log.Info("train.pipeline_stages = auto: joined the pipeline's stages into the whole model and took "+c.String(),
				append(fields, zap.Uint64("step", held), zap.Ints("from", c.From), zap.Int("stage", t.heldStage()))...)
		default:
			t.log.Warn("train.pipeline_stages = auto: the cluster holds another choice; this peer discards its state and takes "+c.String(),
				append(fields, zap.Uint64("own_step", held))...)
		}
	}
	a.choice = &c
	announced := c
	t.payload.Stages = &announced
	if sp, ok := t.c.(StagesPlanner); ok {
		sp.SetPipelineStages(c.Stages)
	}
	if changed && t.payload.Ready != nil {
		t.payload.Ready.Step, t.payload.Ready.Hash, t.payload.Ready.Stage = t.step, t.hash, t.heldStage()
	}
	t.publish()
	if recut || gather {
		return fmt.Errorf("train: this peer cut its model at step %d into %s; entering a new ring epoch", held, c)
	}
	if changed && held > 0 {
		return fmt.Errorf("train: this peer held step %d of another choice of pipeline stages; entering a new ring epoch with %s", held, c)
	}
	return nil
}

// recutLearner replaces the whole model this peer trains with data
// parallelism by a stage of choice c, cut from the whole model's state at
// the step it holds (PipeLearner.SetStageFrom), keeping the step; this
// peer must be one of c.Holders, at c.Step. They take stages 0, 1, …,
// S−1, 0, … in that order, in whichever epoch each adopts c, so that every
// stage has a holder at that step whatever layout the next epoch makes
// (its members fetch the stage it gives them from one). A member behind
// them, or one that joined, takes stage 0 at step 0 (switchLearner) and
// fetches its stage's state later. A failure stops the run.
func (t *Trainer) recutLearner(c StagesChoice, ep gossip.Epoch) error {
	a := t.auto
	ml, ok := t.l.(*ModelLearner)
	if !ok {
		return fmt.Errorf("%w: re-cutting a %T, not a whole model", ErrLearner, t.l)
	}
	i := slices.Index(c.Holders, t.self)
	if i < 0 || len(c.Holders) < c.Stages {
		return fmt.Errorf("%w: %d members held the whole model at step %d (this peer among them: %v); %s needs one per stage", ErrLearner, len(c.Holders), c.Step, i >= 0, c)
	}
	s := i % c.Stages
	cfg := a.base
	cfg.PipelineStages, cfg.BatchSize = config.Stages(c.Stages), c.Stages*cfg.BatchSize
	t.mu.Lock()
	defer t.mu.Unlock()
	state, err := ml.State(t.step)
	if err != nil {
		return fmt.Errorf("%w: the whole model's state at step %d: %w", ErrLearner, t.step, err)
	}
	pl, err := NewPipeLearner(cfg, t.arCfg.BucketBytes, a.train, a.test)
	if err == nil {
		if err = pl.useSplit(c.Split); err == nil {
			err = pl.SetStageFrom(s, ml.Model(), state)
		}
		if err != nil {
			pl.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("%w: cutting the whole model into stage %d of %s: %w", ErrLearner, s, c, err)
	}
	if err := ml.Close(); err != nil {
		t.log.Warn("closing the learner", zap.Error(err))
	}
	a.recutAt = t.step
	return t.useLearner(pl, pl, t.step, s)
}

// switchLearner replaces the learner by one of choice c at step 0: the
// whole model for one stage, else stage 0 of c's cut, each pipeline
// taking S × train.batch_size samples. A failure stops the run (the old
// learner is closed first, to free its device memory).
func (t *Trainer) switchLearner(c StagesChoice) error {
	a := t.auto
	cfg := a.base
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.l.Close(); err != nil {
		t.log.Warn("closing the learner", zap.Error(err))
	}
	var l Learner
	var pl *PipeLearner
	var err error
	if c.Stages == 1 {
		l, err = NewModelLearner(cfg, t.arCfg.BucketBytes, a.train, a.test)
	} else {
		cfg.PipelineStages, cfg.BatchSize = config.Stages(c.Stages), c.Stages*cfg.BatchSize
		if pl, err = NewPipeLearner(cfg, t.arCfg.BucketBytes, a.train, a.test); err == nil {
			if err = pl.useSplit(c.Split); err != nil {
				pl.Close()
			}
		}
		l = pl
	}
	if err != nil {
		return fmt.Errorf("%w: building the learner of %s: %w", ErrLearner, c, err)
	}
	return t.useLearner(l, pl, 0, 0)
}

// useLearner makes l (pl when it holds a pipeline stage, else nil) the
// trainer's learner at step, wanting stage: the checks and codecs of the
// old one go, the parameter hash is computed anew. The caller holds t.mu.
func (t *Trainer) useLearner(l Learner, pl *PipeLearner, step uint64, stage int) error {
	t.l, t.stages = l, pl
	t.step, t.hash, t.prevState, t.wantStage, t.saved = step, "", nil, stage, 0
	t.status.Step = step
	clear(t.checks)
	t.payload.Check = nil
	if err := t.buildCodecs(); err != nil {
		return fmt.Errorf("%w: %w", ErrLearner, err)
	}
	t.status.Codec = t.codecs[0].Spec()
	if _, err := t.paramHash(context.Background()); err != nil {
		return fmt.Errorf("%w: %w", ErrLearner, err)
	}
	return nil
}

// confirmStages stamps this peer's choice with ep when it coordinates ep
// without entering it (a finished peer answering a new epoch), so that
// the members that enter ep adopt it.
func (t *Trainer) confirmStages(ep gossip.Epoch) {
	if a := t.auto; a != nil && a.choice != nil && ep.Coordinator == t.self {
		c := *a.choice
		c.Epoch, c.Digest = ep.Number, ep.Digest()
		a.choice = &c
		announced := c
		t.payload.Stages = &announced
	}
}

// useSplit cuts the model at split (a StagesChoice's, from the
// coordinator's measured layer times) instead of at the parameter
// counts, and holds stage 0 of that cut.
func (l *PipeLearner) useSplit(split []int) error {
	ok := len(split) == l.split.Stages()+1 && split[0] == 0 && split[len(split)-1] == len(l.layers)
	for i := 1; ok && i < len(split); i++ {
		ok = split[i] > split[i-1]
	}
	if !ok {
		return fmt.Errorf("train: the cut %v does not split %d layers into %d stages", split, len(l.layers), l.split.Stages())
	}
	l.split = pipeline.Split(slices.Clone(split))
	return l.SetStage(0, nil)
}
