package train

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/pipeline"
)

// PipeLearner is the Learner of one pipeline stage of a built-in model
// (train.pipeline_stages > 1, docs/pipeline.md): the layers of the stage
// this peer holds, on its one device, with their optimizer. Its Compute
// runs the stage's part of a step through a pipeline.Stage over the
// epoch's transport (Begin), and passes the loss the last stage computes
// back to every stage; BeforeApply adds the other end's part of the shared
// token table's gradient. Which stage it holds changes with the ring
// epoch's layout (SetStage). Every peer cuts the model alike: by
// train.pipeline_split, or Balance over the layers' parameter counts
// (pipeline.ParamCosts).
type PipeLearner struct {
	cfg  config.Train
	mcfg model.Config
	dev  gpu.Device
	dataset
	layers []model.LayerInfo
	split  pipeline.Split
	sched  pipeline.Schedule
	// ladder is the activation codecs a link chooses among, most exact
	// first (pipeline.Ladder; train.activation_codec alone unless
	// train.activation_link_codecs is "auto").
	ladder []string

	// stage is the stage held; m and opt its model and optimizer.
	stage   int
	m       *model.Model
	opt     *model.Optimizer
	layouts []compress.Layout

	// run and tr are the epoch's stage runner and transport (nil outside
	// an epoch).
	run *pipeline.Stage
	tr  pipeline.Transport

	batch model.Batch
	idx   []int
	// loss is the last stage's loss of the last Compute; act and grad
	// the codecs it sent activations and their gradients with.
	loss            float64
	act, grad       string
	inRate, outRate float64
	// eval is the last evaluation through the pipeline, of the held
	// stage's parameters that hash to evalHash ("": none).
	eval     model.Stats
	evalHash string
}

var _ Learner = (*PipeLearner)(nil)

// NewPipeLearner opens the first of train.devices, loads the data (train
// and test as NewModelLearner takes them), cuts the model into
// train.pipeline_stages stages and builds stage 0; the trainer moves it to
// the stage each ring epoch assigns it.
func NewPipeLearner(cfg config.Train, bucketBytes int, train, test *data.Dataset) (*PipeLearner, error) {
	if cfg.PipelineStages < 2 || cfg.MicroBatches < 1 {
		return nil, fmt.Errorf("train: a pipeline learner needs train.pipeline_stages ≥ 2 (got %d) and train.micro_batches ≥ 1 (got %d)", cfg.PipelineStages, cfg.MicroBatches)
	}
	if len(cfg.Devices) != 1 {
		return nil, fmt.Errorf("train: train.pipeline_stages = %d runs one device per peer; train.devices lists %d", cfg.PipelineStages, len(cfg.Devices))
	}
	sched, err := pipeline.ParseSchedule(cfg.PipelineSchedule)
	if err != nil {
		return nil, fmt.Errorf("train: train.pipeline_schedule: %w", err)
	}
	if err := pipeline.ValidateCodec(cfg.ActivationCodec); err != nil {
		return nil, fmt.Errorf("train: train.activation_codec: %w", err)
	}
	ladder := []string{cfg.ActivationCodec}
	switch cfg.ActivationLinkCodecs {
	case config.ActivationLinkCodecsAuto:
		if ladder, err = pipeline.Ladder(cfg.ActivationCodec); err != nil {
			return nil, fmt.Errorf("train: train.activation_codec: %w", err)
		}
	case config.ActivationLinkCodecsOff, "":
	default:
		return nil, fmt.Errorf("train: train.activation_link_codecs %q is not %q or %q", cfg.ActivationLinkCodecs, config.ActivationLinkCodecsOff, config.ActivationLinkCodecsAuto)
	}
	g := cfg.GPT
	l := &PipeLearner{cfg: cfg, sched: sched, ladder: ladder, stage: -1, mcfg: model.Config{Hidden: cfg.Hidden, BucketBytes: bucketBytes,
		MaxBatch: (cfg.BatchSize + cfg.MicroBatches - 1) / cfg.MicroBatches, Dropout: float32(cfg.Dropout),
		GPT: model.GPTConfig{Layers: g.Layers, DModel: g.DModel, Heads: g.Heads, Context: g.Context, Vocab: g.Vocab}}}
	if l.layers, err = model.Layers(cfg.Model, l.mcfg); err != nil {
		return nil, err
	}
	if len(cfg.PipelineSplit) > 0 {
		l.split = slices.Clone(pipeline.Split(cfg.PipelineSplit))
		if err := l.split.Check(len(l.layers)); err != nil {
			return nil, fmt.Errorf("train: train.pipeline_split: %s has %d layers: %w", cfg.Model, len(l.layers), err)
		}
		if l.split.Stages() != int(cfg.PipelineStages) {
			return nil, fmt.Errorf("train: train.pipeline_split %v cuts %d stages, train.pipeline_stages is %d", cfg.PipelineSplit, l.split.Stages(), cfg.PipelineStages)
		}
	} else if l.split, _, err = pipeline.Balance(pipeline.ParamCosts(l.layers), int(cfg.PipelineStages)); err != nil {
		return nil, fmt.Errorf("train: train.pipeline_stages: %s has %d layers: %w", cfg.Model, len(l.layers), err)
	}
	if l.dev, err = gpu.Open(cfg.Devices[0]); err != nil {
		return nil, fmt.Errorf("train: train.devices: %w", err)
	}
	if l.dataset, err = loadDataset(cfg, train, test); err != nil {
		l.Close()
		return nil, err
	}
	if err := l.SetStage(0, nil); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Stages returns the number of stages; Stage the one held.
func (l *PipeLearner) Stages() int { return l.split.Stages() }

// Stage returns the stage this learner holds.
func (l *PipeLearner) Stage() int { return l.stage }

// Split returns the cut of the model's layers into stages.
func (l *PipeLearner) Split() pipeline.Split { return l.split }

// SetStage makes the learner hold stage s with the state c (nil: the
// initial parameters every peer derives from train.seed). It must not be
// called during an epoch (between Begin and End).
func (l *PipeLearner) SetStage(s int, c *model.Checkpoint) error {
	return l.setStage(s, func(m *model.Model, opt *model.Optimizer) error {
		if c == nil {
			return nil
		}
		return m.Restore(c, opt)
	})
}

// SetStageFrom makes the learner hold stage s with its cut of c, a state
// of whole, the whole model of the same configuration (model.CutState):
// the whole model's run continues as a pipeline. It must not be called
// during an epoch.
func (l *PipeLearner) SetStageFrom(s int, whole *model.Model, c *model.Checkpoint) error {
	return l.setStage(s, func(m *model.Model, opt *model.Optimizer) error {
		cut, err := model.CutState(whole, m, c)
		if err != nil {
			return err
		}
		return m.Restore(cut, opt)
	})
}

// setStage makes the learner hold stage s, its model and optimizer then
// set by restore.
func (l *PipeLearner) setStage(s int, restore func(*model.Model, *model.Optimizer) error) error {
	if s < 0 || s >= l.split.Stages() {
		return fmt.Errorf("train: stage %d of %d", s, l.split.Stages())
	}
	if l.run != nil {
		return errors.New("train: changing the stage during an epoch")
	}
	m, err := model.NewStage(l.cfg.Model, l.mcfg, l.dev, l.cfg.Seed, l.split[s], l.split[s+1])
	if err != nil {
		return err
	}
	opt, err := model.NewOptimizer(model.OptimConfig{Name: l.cfg.Optimizer, LR: l.cfg.LR, Momentum: l.cfg.Momentum, WeightDecay: l.cfg.WeightDecay,
		WarmupSteps: int64(l.cfg.WarmupSteps), TotalSteps: int64(l.cfg.Steps)}, m)
	if err == nil {
		err = restore(m, opt)
	}
	if err != nil {
		m.Close()
		return fmt.Errorf("train: stage %d (layers %d to %d): %w", s, l.split[s], l.split[s+1], err)
	}
	if l.m != nil {
		l.m.Close()
	}
	l.stage, l.m, l.opt, l.layouts = s, m, opt, nil
	for _, b := range m.Buckets() {
		l.layouts = append(l.layouts, compress.Layout{Shapes: b.Shapes()})
	}
	return nil
}

// Model returns the held stage's model (tests read its parameters).
func (l *PipeLearner) Model() *model.Model { return l.m }

// Bounds returns what the held stage receives at most: an activation or
// gradient message's payload under train.activation_codec, and the shared
// token table's gradient (0 when the stage holds no side of it).
func (l *PipeLearner) Bounds() (maxPayload, tiedBytes int, err error) {
	numel := func(shape []int) int {
		n := l.m.MaxBatch()
		for _, d := range shape {
			n *= d
		}
		return n
	}
	for _, n := range []int{numel(l.m.StageInputShape()), numel(l.m.StageOutputShape())} {
		p, err := pipeline.LadderPayload(l.ladder, n)
		if err != nil {
			return 0, 0, err
		}
		maxPayload = max(maxPayload, p)
	}
	if _, n, ok := l.m.TiedRange(); ok {
		tiedBytes = 4 * n
	}
	return maxPayload, tiedBytes, nil
}

// Begin starts an epoch: the held stage runs as stage Stage() of a
// pipeline whose messages tr carries; seed seeds stochastic activation
// codecs; rates returns the measured rates in bytes/s of this peer's links
// to the previous and the next stage (0: not measured; nil: none), from
// which train.activation_link_codecs = "auto" chooses each link's codec
// before every step.
func (l *PipeLearner) Begin(tr pipeline.Transport, seed uint64, rates func() (in, out float64)) error {
	run, err := pipeline.NewStage(l.m, tr, pipeline.Config{Stages: l.split.Stages(), Stage: l.stage, Micro: l.cfg.MicroBatches,
		Schedule: l.sched, Codec: l.cfg.ActivationCodec, Seed: seed, LinkCodecs: len(l.ladder) > 1, Rates: rates})
	if err != nil {
		return err
	}
	l.run, l.tr = run, tr
	return nil
}

// WireCodec names the activations' codecs as the pipeline's frames do:
// train.activation_codec, or with train.activation_link_codecs = "auto"
// the codecs each link chooses among, most exact first ("none|bf16|dyn8").
func (l *PipeLearner) WireCodec() string { return strings.Join(l.ladder, "|") }

// LinkCodecs returns the codecs the held stage sent its activations and
// their gradients with in the last step it computed ("" before one, and
// for a side the stage sends nothing on).
func (l *PipeLearner) LinkCodecs() (activations, gradients string) { return l.act, l.grad }

// LinkRates returns the measured rates in bytes/s of the links to the
// previous and the next stage that LinkCodecs were chosen by.
func (l *PipeLearner) LinkRates() (in, out float64) { return l.inRate, l.outRate }

// End ends the epoch Begin started.
func (l *PipeLearner) End() { l.run, l.tr = nil, nil }

// Buckets implements Learner: the held stage's buckets.
func (l *PipeLearner) Buckets() []compress.Layout { return l.layouts }

// NumParams implements Learner: the held stage's parameters.
func (l *PipeLearner) NumParams() int { return l.m.NumParams() }

// Devices implements Learner.
func (l *PipeLearner) Devices() []string { return []string{l.dev.Name()} }

// Settings implements Learner: ModelLearner's, the model identified by its
// whole layer list (peers hold different stages of it), and the pipeline:
// stages, split, micro-batches, activation codec and schedule.
func (l *PipeLearner) Settings() Settings {
	descs := make([]string, len(l.layers))
	for i, ly := range l.layers {
		descs[i] = ly.Describe + ":" + strconv.Itoa(ly.Params)
	}
	s := l.dataset.settings(l.cfg, l.cfg.Model+"["+strings.Join(descs, " ")+"]", 1)
	s["train.eval_samples"] = strconv.Itoa(l.cfg.EvalSamples) // the stages evaluate together
	s["train.pipeline"] = fmt.Sprintf("%d stages %v, %d micro-batches, %s activations, %s", l.split.Stages(), []int(l.split),
		l.cfg.MicroBatches, l.WireCodec(), l.sched)
	return s
}

// Step implements Learner.
func (l *PipeLearner) Step() uint64 { return 0 }

// MaxStateBytes implements Learner: the held stage's parameters and up
// to three optimizer buffers, plus headers.
func (l *PipeLearner) MaxStateBytes() uint64 { return uint64(l.m.NumParams())*4*4 + 1<<20 }

// Compute implements Learner: the held stage's part of step on the
// pipeline's shard (the first stage reads the samples, the last their
// labels). It returns the loss over the shard, which the last stage
// computes (0 on the others: Settle passes it back).
func (l *PipeLearner) Compute(ctx context.Context, step uint64, sh Shard, ready func(b int, g []float32)) (float64, error) {
	if l.run == nil {
		return 0, errors.New("train: pipeline stage outside an epoch")
	}
	if l.stage == 0 || l.stage == l.split.Stages()-1 {
		var err error
		if l.idx, err = l.sampler.Range(l.idx, int64(step), sh.Offset, sh.Size, sh.Global); err != nil {
			return 0, err
		}
		l.batch = l.train.gather(l.batch, l.idx, int64(step), sh.Global)
	}
	res, err := l.run.Step(ctx, step, sh.Size, l.batch, model.NoiseSeed(l.cfg.Seed, int64(step), sh.FirstDevice), func(b int) {
		ready(b, l.m.BucketGrads(b))
	})
	l.loss = res.Stats.Loss
	l.act, l.grad = l.run.LinkCodecs()
	l.inRate, l.outRate = l.run.LinkRates()
	return l.loss, err
}

// Settle finishes step after the stage's all-reduce: it adds the other
// end's part of the shared token table's gradient (every replica then adds
// the same two averages), and decides with the other stages whether the
// pipeline applies the step (pipeline.Stage.Agree: only when every stage's
// averaged gradient is finite). It returns the loss the last stage
// computed over the pipeline's shard, and the verdict.
func (l *PipeLearner) Settle(ctx context.Context, step uint64) (float64, bool, error) {
	if l.run == nil {
		return 0, false, errors.New("train: pipeline stage outside an epoch")
	}
	if err := l.run.SumTied(ctx, step); err != nil && !errors.Is(err, pipeline.ErrNoTie) {
		return 0, false, err
	}
	return l.run.Agree(ctx, step, !model.HasNonFinite(l.m.Grads()), l.loss)
}

// Apply implements Learner.
func (l *PipeLearner) Apply(_ context.Context, step uint64) error {
	l.m.ApplyGradients(l.opt, int64(step))
	return nil
}

// Params implements Learner: the held stage's parameters.
func (l *PipeLearner) Params(context.Context) ([]float32, error) { return l.m.Params(), nil }

// State implements Learner: the held stage's state.
func (l *PipeLearner) State(step uint64) (*model.Checkpoint, error) {
	return l.m.Checkpoint(l.opt, int64(step), [32]byte{}), nil
}

// Restore implements Learner: a state of the held stage.
func (l *PipeLearner) Restore(_ context.Context, c *model.Checkpoint) error {
	return l.m.Restore(c, l.opt)
}

// Evaluate implements Learner: a stage cannot evaluate on its own; it
// returns the figures of the last evaluation through the pipeline
// (EvaluatePipeline) while the held stage's parameters are the ones it
// evaluated, and ErrNoEvaluation otherwise.
func (l *PipeLearner) Evaluate() (model.Stats, error) {
	if st, ok := l.evaluated(); ok {
		return st, nil
	}
	return model.Stats{}, ErrNoEvaluation
}

// Close implements Learner.
func (l *PipeLearner) Close() error {
	if l.m != nil {
		l.m.Close()
	}
	if l.dev == nil {
		return nil
	}
	err := gpu.CloseAll([]gpu.Device{l.dev})
	l.dev = nil
	return err
}

// joinStates joins cps, the states of every stage of the learner's cut at
// one step, into the state of whole, the whole model of the same
// configuration (model.JoinStates).
func (l *PipeLearner) joinStates(whole *model.Model, cps []*model.Checkpoint) (*model.Checkpoint, error) {
	if len(cps) != l.split.Stages() {
		return nil, fmt.Errorf("train: joining %d states into %d stages", len(cps), l.split.Stages())
	}
	stages := make([]*model.Model, 0, len(cps))
	defer func() {
		for _, m := range stages {
			m.Close()
		}
	}()
	for s := range cps {
		m, err := model.NewStage(l.cfg.Model, l.mcfg, l.dev, l.cfg.Seed, l.split[s], l.split[s+1])
		if err != nil {
			return nil, err
		}
		stages = append(stages, m)
	}
	return model.JoinStates(whole, stages, cps)
}
