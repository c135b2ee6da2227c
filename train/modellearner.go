package train

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
)

// ModelLearner is the Learner of the built-in models (train.model): a
// model.Model on the local devices, its optimizer, and its data:
// Fashion-MNIST for the classifiers, a text corpus (train.data) for gpt.
type ModelLearner struct {
	cfg  config.Train
	devs []gpu.Device
	m    *model.Model
	opt  *model.Optimizer
	dataset
	batches []model.Batch
	idx     []int
	layouts []compress.Layout
}

// dataset is the training and held-out data of train.model, and the
// sampler that draws every step's global batch from it.
type dataset struct {
	train   source
	test    model.Samples
	corpus  string // gpt: what identifies the corpus across the cluster
	text    *data.TextCorpus
	sampler *data.Sampler
}

// loadDataset loads cfg's data: a text corpus for gpt, else train and
// test (Fashion-MNIST from train.data_dir when either is nil).
func loadDataset(cfg config.Train, train, test *data.Dataset) (dataset, error) {
	var d dataset
	var err error
	if cfg.Model == "gpt" {
		err = d.loadText(cfg)
	} else {
		err = d.loadImages(cfg, train, test)
	}
	if err != nil {
		return dataset{}, err
	}
	d.sampler = data.NewSampler(cfg.Seed, d.train.Len())
	return d, nil
}

var _ Learner = (*ModelLearner)(nil)

// source is a training set the Sampler draws from: a Fashion-MNIST Dataset
// or a text corpus's windows.
type source interface {
	Len() int
	// gather fills dst with samples idx of step's global batch of global.
	gather(dst model.Batch, idx []int, step int64, global int) model.Batch
}

type imageSource struct{ *data.Dataset }

func (s imageSource) gather(dst model.Batch, idx []int, _ int64, _ int) model.Batch {
	return s.Gather(dst, idx)
}

type textSource struct{ *data.TextWindows }

func (s textSource) gather(dst model.Batch, idx []int, step int64, global int) model.Batch {
	return s.GatherStep(dst, idx, step, global)
}

// NewModelLearner opens train.devices, loads the data (train and test, when
// not nil, are used instead of loading Fashion-MNIST from train.data_dir)
// and builds the model and optimizer of cfg with fusion buckets of
// bucketBytes.
func NewModelLearner(cfg config.Train, bucketBytes int, train, test *data.Dataset) (*ModelLearner, error) {
	l := &ModelLearner{cfg: cfg}
	var err error
	if l.devs, err = gpu.OpenAll(cfg.Devices); err != nil {
		return nil, fmt.Errorf("train: train.devices: %w", err)
	}
	if l.dataset, err = loadDataset(cfg, train, test); err != nil {
		l.Close()
		return nil, err
	}
	g := cfg.GPT
	mcfg := model.Config{Hidden: cfg.Hidden, BucketBytes: bucketBytes, MaxBatch: cfg.BatchSize, Dropout: float32(cfg.Dropout),
		GPT: model.GPTConfig{Layers: g.Layers, DModel: g.DModel, Heads: g.Heads, Context: g.Context, Vocab: g.Vocab}}
	if l.m, err = model.New(cfg.Model, mcfg, l.devs, cfg.Seed); err != nil {
		l.Close()
		return nil, err
	}
	if err := l.dataset.fits(cfg.Model, l.m.InputShape()); err != nil {
		l.Close()
		return nil, err
	}
	l.opt, err = model.NewOptimizer(model.OptimConfig{
		Name: cfg.Optimizer, LR: cfg.LR, Momentum: cfg.Momentum, WeightDecay: cfg.WeightDecay,
		WarmupSteps: int64(cfg.WarmupSteps), TotalSteps: int64(cfg.Steps), ClipNorm: cfg.ClipNorm,
	}, l.m)
	if err != nil {
		l.Close()
		return nil, err
	}
	l.batches = make([]model.Batch, len(l.devs))
	for _, b := range l.m.Buckets() {
		l.layouts = append(l.layouts, compress.Layout{Shapes: b.Shapes()})
	}
	return l, nil
}

// fits refuses image datasets whose samples are not the size of the
// model's input (name's): every step would fail on them, and be retried
// for ever.
func (d *dataset) fits(name string, input []int) error {
	want := 1
	for _, n := range input {
		want *= n
	}
	for _, set := range []struct {
		what string
		ds   *data.Dataset
	}{{"training", trainImages(d.train)}, {"test", testImages(d.test)}} {
		if set.ds != nil && set.ds.SampleLen() != want {
			return fmt.Errorf("%w: the %s images have %d values each, %s takes inputs of shape %v (%d values)", ErrLearner, set.what, set.ds.SampleLen(), name, input, want)
		}
	}
	return nil
}

// trainImages is the Fashion-MNIST training set behind s, nil for text.
func trainImages(s source) *data.Dataset {
	if img, ok := s.(imageSource); ok {
		return img.Dataset
	}
	return nil
}

// testImages is the Fashion-MNIST test set behind s, nil for text.
func testImages(s model.Samples) *data.Dataset {
	ds, _ := s.(*data.Dataset)
	return ds
}

// loadImages takes train and test, or loads Fashion-MNIST from
// train.data_dir when either is nil, and limits them to
// train.train_samples and train.eval_samples.
func (d *dataset) loadImages(cfg config.Train, train, test *data.Dataset) error {
	if train == nil || test == nil {
		var err error
		if train, test, err = data.LoadFashionMNIST(cfg.DataDir); err != nil {
			if errors.Is(err, data.ErrNoDataset) {
				return fmt.Errorf("%w\n  install it with `apt-get install dataset-fashion-mnist` (scripts/setup.sh does), or set train.data_dir", err)
			}
			return err
		}
	}
	if cfg.TrainSamples > 0 && cfg.TrainSamples < train.Len() {
		train = train.Subset(cfg.TrainSamples)
	}
	if cfg.EvalSamples > 0 && cfg.EvalSamples < test.Len() {
		test = test.Subset(cfg.EvalSamples)
	}
	d.train, d.test = imageSource{train}, test
	return nil
}

// loadText loads the gpt's corpus (train.data, or the Go standard
// library's source): training windows, and train.eval_samples held-out
// windows (0: all of them).
func (d *dataset) loadText(cfg config.Train) error {
	opts := data.TextOptions{Extensions: cfg.DataExt, HeldOut: data.DefaultHeldOut, MaxBytes: cfg.DataMaxBytes, Context: cfg.GPT.Context}
	var c *data.TextCorpus
	var err error
	if cfg.Data == "" {
		c, err = data.LoadGoSource(opts)
	} else {
		c, err = data.LoadText(cfg.Data, opts)
	}
	if err != nil {
		return fmt.Errorf("train: train.data: %w", err)
	}
	h := sha256.New()
	h.Write(c.TrainBytes())
	h.Write(c.HeldOutBytes())
	d.corpus = fmt.Sprintf("%d bytes:%x", c.Size(), h.Sum(nil)[:8])
	d.text = c
	d.train, d.test = textSource{c.Train(cfg.Seed)}, c.HeldOutSamples(cfg.EvalSamples)
	return nil
}

// Corpus returns gpt's text corpus (nil for the other models).
func (l *ModelLearner) Corpus() *data.TextCorpus { return l.text }

// Model returns the model (tests read its parameters).
func (l *ModelLearner) Model() *model.Model { return l.m }

// Buckets implements Learner.
func (l *ModelLearner) Buckets() []compress.Layout { return l.layouts }

// NumParams implements Learner.
func (l *ModelLearner) NumParams() int { return l.m.NumParams() }

// Devices implements Learner.
func (l *ModelLearner) Devices() []string {
	names := make([]string, len(l.devs))
	for i, d := range l.devs {
		names[i] = d.Name()
	}
	return names
}

// Settings implements Learner: the model and its layout, the optimizer and
// its schedule, the data and the seed.
func (l *ModelLearner) Settings() Settings {
	return l.settings(l.cfg, l.m.Signature(), len(l.devs))
}

// settings returns the settings of a learner of cfg on this data: the
// model (signature identifies its layout), the optimizer and its
// schedule, the data and the seed.
func (d *dataset) settings(cfg config.Train, signature string, devices int) Settings {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	sig := sha256.Sum256([]byte(signature))
	s := Settings{
		"train.model":         cfg.Model + ":" + hex.EncodeToString(sig[:8]),
		"train.optimizer":     cfg.Optimizer,
		"train.lr":            f(cfg.LR),
		"train.momentum":      f(cfg.Momentum),
		"train.weight_decay":  f(cfg.WeightDecay),
		"train.clip_norm":     f(cfg.ClipNorm),
		"train.dropout":       f(cfg.Dropout),
		"train.batch_size":    strconv.Itoa(cfg.BatchSize),
		"train.train_samples": strconv.Itoa(cfg.TrainSamples),
		"train.devices":       strconv.Itoa(devices),
	}
	if d.corpus != "" {
		s["train.data"] = d.corpus
	}
	return s
}

// Step implements Learner: a new model has completed no step (the Trainer
// resumes checkpoints itself).
func (l *ModelLearner) Step() uint64 { return 0 }

// MaxStateBytes implements Learner: the parameters and up to three
// optimizer buffers of the same size, plus headers.
func (l *ModelLearner) MaxStateBytes() uint64 {
	return uint64(l.m.NumParams())*4*4 + 1<<20
}

// Compute implements Learner.
func (l *ModelLearner) Compute(_ context.Context, step uint64, sh Shard, ready func(b int, g []float32)) (float64, error) {
	per := l.cfg.BatchSize
	var err error
	if l.idx, err = l.sampler.Range(l.idx, int64(step), sh.Offset, sh.Size, sh.Global); err != nil {
		return 0, err
	}
	for d := range l.devs {
		l.batches[d] = l.train.gather(l.batches[d], l.idx[d*per:(d+1)*per], int64(step), sh.Global)
	}
	stats, err := l.m.ComputeGradients(l.batches, model.NoiseSeed(l.cfg.Seed, int64(step), sh.FirstDevice), func(b int) {
		ready(b, l.m.BucketGrads(b))
	})
	return stats.Loss, err
}

// Apply implements Learner.
func (l *ModelLearner) Apply(_ context.Context, step uint64) error {
	l.m.ApplyGradients(l.opt, int64(step))
	return nil
}

// Params implements Learner.
func (l *ModelLearner) Params(context.Context) ([]float32, error) { return l.m.Params(), nil }

// SetParams implements ParamSetter.
func (l *ModelLearner) SetParams(_ context.Context, p []float32) error {
	if len(p) != l.m.NumParams() {
		return fmt.Errorf("train: %d parameters given, the model has %d", len(p), l.m.NumParams())
	}
	copy(l.m.Params(), p)
	l.m.SyncReplicas()
	return nil
}

// State implements Learner. The Trainer calls it under its lock, so the
// copy it takes is consistent.
func (l *ModelLearner) State(step uint64) (*model.Checkpoint, error) {
	return l.m.Checkpoint(l.opt, int64(step), [32]byte{}), nil
}

// Restore implements Learner.
func (l *ModelLearner) Restore(_ context.Context, c *model.Checkpoint) error {
	return l.m.Restore(c, l.opt)
}

// Evaluate implements Learner: the test set (train.eval_samples of it).
func (l *ModelLearner) Evaluate() (model.Stats, error) { return l.m.Evaluate(l.test) }

// Close implements Learner: it frees the model and closes the devices.
func (l *ModelLearner) Close() error {
	if l.m != nil && l.devs != nil {
		l.m.Close() // its host-side parameters stay readable
	}
	err := gpu.CloseAll(l.devs)
	l.devs = nil
	return err
}
