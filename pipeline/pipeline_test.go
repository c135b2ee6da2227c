package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
)

// tinyGPT is the configuration of the correctness tests: two blocks, so
// that the gpt's 5 layers cut into up to 5 stages.
var tinyGPT = model.GPTConfig{Layers: 2, DModel: 16, Heads: 2, Context: 8, Vocab: 32}

// problem is a model and a batch to compute one step's gradients on, the
// whole model's (unsplit, the whole batch at once) as the reference.
type problem struct {
	name  string
	cfg   model.Config
	n     int
	batch model.Batch
	whole *model.Model
	loss  model.Stats
	grads map[string][]float32
}

// byName returns m's tensors of v (its Params or Grads) by name.
func byName(m *model.Model, v []float32) map[string][]float32 {
	out := map[string][]float32{}
	for _, b := range m.Buckets() {
		for _, t := range b.Tensors {
			out[t.Name] = v[b.Offset+t.Offset : b.Offset+t.Offset+t.Len]
		}
	}
	return out
}

// wholeName maps a stage's tensor name to the whole model's: a head's copy
// of the token table is layer 0's table.
func wholeName(whole map[string][]float32, name string) string {
	if !strings.Contains(name, ".tied_head(") {
		return name
	}
	for w := range whole {
		if strings.HasPrefix(w, "0.") && strings.HasSuffix(w, ".wte") {
			return w
		}
	}
	return name
}

// newProblem builds model name with perturbed parameters (so that biases
// and LayerNorm shifts are generic) and a random batch of n samples, and
// computes the reference loss and gradients.
func newProblem(t testing.TB, name string, cfg model.Config, n int) *problem {
	t.Helper()
	cfg.MaxBatch = n
	whole := perturbedModel(t, name, cfg, 5)
	b := whole.RandomBatch(n, 9)
	st, err := whole.ComputeGradients([]model.Batch{b}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &problem{name: name, cfg: cfg, n: n, batch: b, whole: whole, loss: st, grads: byName(whole, whole.Grads())}
}

// perturbedModel builds the whole model name (seed 11) and perturbs its
// parameters with noise drawn from seed, so that biases and LayerNorm
// shifts are generic.
func perturbedModel(t testing.TB, name string, cfg model.Config, seed uint64) *model.Model {
	t.Helper()
	whole, err := model.New(name, cfg, []gpu.Device{gpu.NewCPU(0)}, 11)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(whole.Close)
	rng := rand.New(rand.NewPCG(seed, 9))
	for i := range whole.Params() {
		whole.Params()[i] += float32(rng.NormFloat64() * 0.05)
	}
	whole.SyncReplicas()
	return whole
}

// outcome is what a pipelined step computed: the last stage's loss, every
// tensor's gradient by the whole model's names (the first stage's side of
// the shared table after SumTied), each stage's result, and whether the
// two sides of the shared table were equal bit for bit.
type outcome struct {
	loss       model.Stats
	grads      map[string][]float32
	results    []Result
	tiedEqual  bool
	tiedShared bool
}

// runPipeline runs one step of p's batch through stages cut at split, M
// micro-batches, on the given schedule and codec, each stage on its own
// goroutine over a MemNetwork.
func runPipeline(t testing.TB, p *problem, split Split, M int, sc Schedule, codec string) outcome {
	t.Helper()
	return runPipelineConfig(t, p, split, Config{Micro: M, Schedule: sc, Codec: codec})
}

// runPipelineConfig is runPipeline with the stages' Config c (Stages,
// Stage and Seed filled in by newStages).
func runPipelineConfig(t testing.TB, p *problem, split Split, c Config) outcome {
	t.Helper()
	S := split.Stages()
	net := NewMemNetwork(S)
	want := byName(p.whole, p.whole.Params())
	stages := newStages(t, p.name, p.cfg, p.whole, split, net, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a deadlock, not a wait
	defer cancel()
	out := outcome{results: make([]Result, S), grads: map[string][]float32{}}
	errs := make([]error, S)
	var wg sync.WaitGroup
	for s, st := range stages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out.results[s], errs[s] = st.Step(ctx, 3, p.n, p.batch, 0, nil); errs[s] != nil {
				cancel()
				return
			}
			if err := st.SumTied(ctx, 3); err != nil && !errors.Is(err, ErrNoTie) {
				errs[s] = err
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := net.Pending(); n != 0 {
		t.Errorf("%d messages left unreceived", n)
	}
	out.loss = out.results[S-1].Stats
	for s, st := range stages {
		m := st.Model()
		for name, g := range byName(m, m.Grads()) {
			if s == S-1 && strings.Contains(name, ".tied_head(") {
				out.tiedShared = true
				out.tiedEqual = slices.Equal(g, out.grads[wholeName(want, name)])
				continue
			}
			out.grads[wholeName(want, name)] = g
		}
	}
	return out
}

// newStages builds the stages of model name cut at split, each with the
// parameters of the whole model from, and their runners over net: c with
// Stages, Stage and Seed (c.Seed plus the stage) filled in.
func newStages(t testing.TB, name string, cfg model.Config, from *model.Model, split Split, net *MemNetwork, c Config) []*Stage {
	t.Helper()
	want := byName(from, from.Params())
	S := split.Stages()
	stages := make([]*Stage, S)
	seed := c.Seed
	for s := range S {
		m, err := model.NewStage(name, cfg, gpu.NewCPU(s), 11, split[s], split[s+1])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		for name, v := range byName(m, m.Params()) {
			copy(v, want[wholeName(want, name)])
		}
		m.SyncReplicas()
		c.Stages, c.Stage, c.Seed = S, s, seed+uint64(s)
		if stages[s], err = NewStage(m, net.Stage(s), c); err != nil {
			t.Fatal(err)
		}
	}
	return stages
}

// gradError returns the largest per-tensor relative error ‖g−ref‖₂/‖ref‖₂
// over the tensors of ref, with the tensor's name, and the error of all
// the tensors together.
func gradError(t testing.TB, got, ref map[string][]float32) (worst float64, where string, global float64) {
	t.Helper()
	var dAll, nAll float64
	for name, r := range ref {
		g, ok := got[name]
		if !ok || len(g) != len(r) {
			t.Fatalf("tensor %s: %d values in the pipeline, %d in the whole model", name, len(g), len(r))
		}
		var d, n float64
		for i := range r {
			d += math.Pow(float64(g[i])-float64(r[i]), 2)
			n += float64(r[i]) * float64(r[i])
		}
		dAll += d
		nAll += n
		if e := math.Sqrt(d / max(n, 1e-300)); e > worst {
			worst, where = e, name
		}
	}
	if len(got) != len(ref) {
		t.Fatalf("the pipeline has %d tensors, the whole model %d", len(got), len(ref))
	}
	return worst, where, math.Sqrt(dAll / nAll)
}

// exactBound is the largest relative difference a pipeline with codec
// "none" may show against the whole model, per tensor (‖Δg‖₂/‖g‖₂) and for
// the loss. The two compute the same sums in another order (micro-batch
// by micro-batch instead of the whole batch at once; the shared table's
// two parts added at the end), so each value differs by a few fp32
// roundings of its terms: about n·2⁻²⁴ ≈ 6·10⁻⁸·n relative to the sum of
// the terms' magnitudes for n terms, and less in the norm. A tensor sums
// at most a few hundred products per value here; 1e-5 leaves a margin of
// more than ten over the largest difference observed (about 5e-7, the
// bias and LayerNorm gradients, sums of many terms that cancel) and is
// still a thousand times smaller than any real error (a micro-batch lost
// or counted twice moves a gradient by 1/M).
const exactBound = 1e-5

// TestPipelineMatchesWholeModel checks that pipelines with codec none give
// the whole model's loss and gradients within exactBound: the gpt in 2 and
// 3 stages (the tied table split between the first and the last), the mlp
// and the cnn in 2, over 1 to 4 micro-batches (3 of 8 samples: uneven),
// on both schedules, which must agree with each other bit for bit.
func TestPipelineMatchesWholeModel(t *testing.T) {
	gpt := newProblem(t, "gpt", model.Config{GPT: tinyGPT}, 8)
	mlp := newProblem(t, "mlp", model.Config{Hidden: []int{32, 16}}, 8)
	cnn := newProblem(t, "cnn", model.Config{}, 4)
	for _, tc := range []struct {
		p     *problem
		split Split
		micro []int
	}{
		{gpt, Split{0, 2, 5}, []int{1, 3, 4}},
		{gpt, Split{0, 1, 4, 5}, []int{2, 8}},
		{gpt, Split{0, 5}, []int{4}}, // one stage: gradient accumulation only
		{mlp, Split{0, 3, 5}, []int{1, 4}},
		{cnn, Split{0, 4, 10}, []int{2}}, // conv, relu, pool, conv | relu, pool, flatten, linear, relu, linear
	} {
		for _, M := range tc.micro {
			name := fmt.Sprintf("%s/%v/M=%d", tc.p.name, []int(tc.split), M)
			t.Run(name, func(t *testing.T) {
				var first outcome
				for _, sc := range []Schedule{OneFOneB, GPipe} {
					o := runPipeline(t, tc.p, tc.split, M, sc, "none")
					worst, where, global := gradError(t, o.grads, tc.p.grads)
					dl := math.Abs(o.loss.Loss-tc.p.loss.Loss) / tc.p.loss.Loss
					t.Logf("%v: worst tensor %s %.2g, all tensors %.2g, loss %.2g", sc, where, worst, global, dl)
					if worst > exactBound || dl > exactBound || o.loss.Samples != tc.p.loss.Samples {
						t.Errorf("%v: gradient of %s differs by %.3g (bound %g), loss by %.3g, %d labels (want %d)",
							sc, where, worst, exactBound, dl, o.loss.Samples, tc.p.loss.Samples)
					}
					if o.tiedShared && !o.tiedEqual {
						t.Errorf("%v: the two sides of the shared table differ after SumTied", sc)
					}
					if o.tiedShared != (tc.p.name == "gpt" && tc.split.Stages() > 1) {
						t.Errorf("%v: shared table held by both ends: %v", sc, o.tiedShared)
					}
					if sc == OneFOneB {
						first = o
						continue
					}
					for name, g := range o.grads {
						if !slices.Equal(g, first.grads[name]) {
							t.Errorf("gpipe and 1f1b differ on %s", name)
						}
					}
					if o.loss != first.loss {
						t.Errorf("gpipe loss %+v, 1f1b %+v", o.loss, first.loss)
					}
				}
			})
		}
	}
}

// TestPipelineBytes checks the bytes a 2-stage gpt pipeline sends with
// codec none: each of the M micro-batches' activations forward and their
// gradients back, n·T·D fp32 values each way in all.
func TestPipelineBytes(t *testing.T) {
	p := newProblem(t, "gpt", model.Config{GPT: tinyGPT}, 8)
	o := runPipeline(t, p, Split{0, 2, 5}, 4, OneFOneB, "none")
	want := int64(8 * 8 * 16 * 4)
	if r := o.results; r[0].Sent != want || r[0].Received != want || r[1].Sent != want || r[1].Received != want {
		t.Errorf("bytes %+v, want %d each way", r, want)
	}
	if o.results[0].Recomputed != 4 || o.results[1].Recomputed != 0 {
		t.Errorf("recomputed %d and %d forward passes, want 4 (1F1B stage 0 of 2, 4 micro-batches: F0 F1 B0* F2 B1* F3 B2* B3*) and 0", o.results[0].Recomputed, o.results[1].Recomputed)
	}
}

// codecBound is, per activation codec, the largest relative error of the
// gradient of all tensors together (‖Δg‖₂/‖g‖₂ against the whole model)
// and of the loss that TestPipelineCodecError accepts for one step of the
// tiny gpt in 3 stages. The figures measured (go test -v -run
// CodecError ./pipeline) are a fraction of these; the bounds catch a codec
// applied wrongly (the wrong block, the wrong tensor), which gives errors
// of order 1.
var codecBound = map[string][2]float64{
	"fp16": {2e-3, 1e-3},
	"bf16": {2e-2, 1e-2},
	"int8": {5e-2, 1e-2},
	"dyn8": {5e-2, 1e-2},
}

// TestPipelineCodecError measures what compressing the activations and
// their gradients costs in gradient and loss error, and checks the bytes
// sent shrink by the codec's ratio.
func TestPipelineCodecError(t *testing.T) {
	p := newProblem(t, "gpt", model.Config{GPT: tinyGPT}, 8)
	split := Split{0, 2, 4, 5}
	exact := runPipeline(t, p, split, 4, OneFOneB, "none")
	for _, codec := range slices.Sorted(func(yield func(string) bool) {
		for c := range codecBound {
			if !yield(c) {
				return
			}
		}
	}) {
		o := runPipeline(t, p, split, 4, OneFOneB, codec)
		worst, where, global := gradError(t, o.grads, p.grads)
		dl := math.Abs(o.loss.Loss-p.loss.Loss) / p.loss.Loss
		ratio := float64(o.results[0].Sent) / float64(exact.results[0].Sent)
		t.Logf("%-15s gradient error %.3g (worst tensor %s %.3g), loss error %.3g, bytes ×%.3f", codec, global, where, worst, dl, ratio)
		if b := codecBound[codec]; global > b[0] || dl > b[1] {
			t.Errorf("%s: gradient error %.3g (bound %g), loss error %.3g (bound %g)", codec, global, b[0], dl, b[1])
		}
		if !o.tiedEqual {
			t.Errorf("%s: the two sides of the shared table differ after SumTied", codec)
		}
		if ratio > 0.55 || ratio < 0.2 {
			t.Errorf("%s: sent %d bytes, %0.3f of none's", codec, o.results[0].Sent, ratio)
		}
	}
}

// failing is a Transport whose sends fail after a number of successes.
type failing struct {
	Transport
	left int
}

func (f *failing) Send(ctx context.Context, k Key, p []byte) error {
	if f.left == 0 {
		return errors.New("peer gone")
	}
	f.left--
	return f.Transport.Send(ctx, k, p)
}

// TestStepFailures checks that a lost peer fails the step on every stage
// (the sender with the transport's error, the waiting receivers when the
// step's context ends) and that bad arguments are errors.
func TestStepFailures(t *testing.T) {
	p := newProblem(t, "gpt", model.Config{GPT: tinyGPT}, 4)
	net := NewMemNetwork(2)
	var stages []*Stage
	for s, r := range [][2]int{{0, 2}, {2, 5}} {
		m, err := model.NewStage("gpt", p.cfg, gpu.NewCPU(s), 11, r[0], r[1])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		tr := net.Stage(s)
		if s == 0 {
			tr = &failing{Transport: tr, left: 1}
		}
		st, err := NewStage(m, tr, Config{Stages: 2, Stage: s, Micro: 2})
		if err != nil {
			t.Fatal(err)
		}
		stages = append(stages, st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for s, st := range stages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, errs[s] = st.Step(ctx, 1, 4, p.batch, 0, nil); errs[s] != nil {
				cancel() // the trainer aborts the step on every stage
			}
		}()
	}
	wg.Wait()
	cancel()
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "peer gone") || !strings.Contains(errs[0].Error(), "micro-batch 1 activation") {
		t.Errorf("stage 0: %v", errs[0])
	}
	if errs[1] == nil || !errors.Is(errs[1], context.Canceled) {
		t.Errorf("stage 1: %v", errs[1])
	}
	ctx = context.Background()
	if _, err := stages[1].Step(ctx, 2, 4, model.Batch{Y: p.batch.Y[:5]}, 0, nil); err == nil || !strings.Contains(err.Error(), "labels") {
		t.Errorf("short labels: %v", err)
	}
	if _, err := stages[0].Step(ctx, 2, 4, model.Batch{X: p.batch.X[:3]}, 0, nil); err == nil || !strings.Contains(err.Error(), "input values") {
		t.Errorf("short inputs: %v", err)
	}
	if _, err := stages[0].Step(ctx, 2, 1, model.Batch{}, 0, nil); err == nil || !strings.Contains(err.Error(), "micro-batches") {
		t.Errorf("fewer samples than micro-batches: %v", err)
	}
	m := stages[0].Model()
	if _, err := NewStage(m, net.Stage(1), Config{Stages: 2, Stage: 1, Micro: 2}); err == nil {
		t.Error("a first stage's layers as stage 1: no error")
	}
	if _, err := NewStage(m, net.Stage(0), Config{Stages: 2, Stage: 0, Micro: 2, Codec: "onebit"}); err == nil || !strings.Contains(err.Error(), "error-feedback") {
		t.Errorf("onebit activations: %v", err)
	}
	if err := ValidateCodec("topk"); err == nil {
		t.Error("topk activations: no error")
	}
	if err := ValidateCodec("qsgd:bits=8"); err != nil {
		t.Errorf("qsgd activations: %v", err)
	}
}

// TestMemNetwork checks routing, a duplicate send, and a receive that the
// context ends.
func TestMemNetwork(t *testing.T) {
	net := NewMemNetwork(3)
	ctx := context.Background()
	k := Key{Step: 1, Micro: 2, Kind: Activation}
	if err := net.Stage(0).Send(ctx, k, []byte{1}); err != nil {
		t.Fatal(err)
	}
	if err := net.Stage(0).Send(ctx, k, []byte{1}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate: %v", err)
	}
	if p, err := net.Stage(1).Recv(ctx, k); err != nil || !slices.Equal(p, []byte{1}) {
		t.Errorf("Recv = %v, %v", p, err)
	}
	for _, tc := range []struct {
		s int
		k Kind
	}{{2, Activation}, {0, Gradient}, {1, Tied}} {
		if err := net.Stage(tc.s).Send(ctx, Key{Kind: tc.k}, nil); err == nil {
			t.Errorf("stage %d sending %v: no error", tc.s, tc.k)
		}
	}
	if err := net.Stage(2).Send(ctx, Key{Kind: Tied}, []byte{7}); err != nil {
		t.Fatal(err)
	}
	if p, err := net.Stage(0).Recv(ctx, Key{Kind: Tied}); err != nil || p[0] != 7 {
		t.Errorf("tied: %v, %v", p, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := net.Stage(1).Recv(cctx, Key{Kind: Gradient}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Recv: %v", err)
	}
	if net.Pending() != 0 {
		t.Errorf("%d pending", net.Pending())
	}
}

// BenchmarkActivationCodecs runs one step of a small gpt (4 blocks of
// width 64, 32 tokens, 16 samples in 4 micro-batches) in 3 stages per
// codec, and reports the gradient's and the loss's relative error against
// the whole model, and the activation bytes stage 0 sends per step (the
// time per op includes building the stages):
//
//	go test -run '^$' -bench ActivationCodecs -benchtime 5x ./pipeline
func BenchmarkActivationCodecs(b *testing.B) {
	cfg := model.Config{GPT: model.GPTConfig{Layers: 4, DModel: 64, Heads: 4, Context: 32, Vocab: 256}}
	p := newProblem(b, "gpt", cfg, 16)
	for _, codec := range []string{"none", "fp16", "bf16", "int8", "dyn8", "dyn8:block=256", "qsgd:bits=8"} {
		b.Run(codec, func(b *testing.B) {
			var o outcome
			for b.Loop() {
				o = runPipeline(b, p, Split{0, 3, 5, 7}, 4, OneFOneB, codec)
			}
			_, _, global := gradError(b, o.grads, p.grads)
			b.ReportMetric(global, "grad-rel-err")
			b.ReportMetric(math.Abs(o.loss.Loss-p.loss.Loss)/p.loss.Loss, "loss-rel-err")
			b.ReportMetric(float64(o.results[0].Sent), "act-B/step")
		})
	}
}
