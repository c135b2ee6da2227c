package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
)

// evalBound is the largest relative difference between a pipeline's
// held-out loss with codec none and the whole model's Evaluate on the same
// parameters and chunks. A chain of stages computes each chunk's forward
// pass as the whole model does (model.TestStageChainMatchesWholeModel), and
// both merge the chunks' figures in the same order in float64, so the two
// are expected to be equal to the bit (as observed for every case); the bound allows the fp32 rounding
// of a differently fused sum (n·2⁻²⁴ relative for a sum of n terms, n at
// most a few hundred here) and is still ten thousand times smaller than a
// chunk lost or counted twice (1/chunks of the loss).
const evalBound = 1e-6

// evalProblem is a whole model with perturbed parameters, a held-out set
// and the whole model's figures on it in chunks of mb samples.
type evalProblem struct {
	name  string
	cfg   model.Config
	whole *model.Model
	ds    model.BatchSamples
	ref   model.Stats
}

func newEvalProblem(t testing.TB, name string, cfg model.Config, mb, n int) *evalProblem {
	t.Helper()
	cfg.MaxBatch = mb
	whole := perturbedModel(t, name, cfg, 7)
	ds := model.BatchSamples{B: whole.RandomBatch(n, 4), N: n}
	ref, err := whole.Evaluate(ds)
	if err != nil {
		t.Fatal(err)
	}
	return &evalProblem{name: name, cfg: cfg, whole: whole, ds: ds, ref: ref}
}

// evalPipeline evaluates p's held-out set through stages cut at split
// with the whole model's parameters (c: micro-batches, codec, seed), each
// stage on its own goroutine over a MemNetwork, and returns every stage's
// figures.
func evalPipeline(t testing.TB, p *evalProblem, split Split, c Config) []model.Stats {
	t.Helper()
	net := NewMemNetwork(split.Stages())
	stages := newStages(t, p.name, p.cfg, p.whole, split, net, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a deadlock, not a wait
	defer cancel()
	figures, errs := make([]model.Stats, len(stages)), make([]error, len(stages))
	var wg sync.WaitGroup
	for s, st := range stages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if figures[s], errs[s] = st.Evaluate(ctx, 5, p.ds); errs[s] != nil {
				cancel()
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
	return figures
}

// TestEvaluateMatchesWholeModel: a pipeline with codec none reports the
// whole model's held-out figures on the same parameters (the loss within
// evalBound, the labels counted and predicted right equal), on every stage
// alike: the gpt in 2 and 3 stages, the mlp and the cnn in 2, with the
// held-out set cut unevenly into chunks and rounds (23 samples in chunks
// of 4: 6 chunks, the last of 3; 1, 2 and 4 micro-batches per round, so
// that the window of two rounds in flight is exercised and a round may be
// short).
func TestEvaluateMatchesWholeModel(t *testing.T) {
	const mb, n = 4, 23
	gpt := newEvalProblem(t, "gpt", model.Config{GPT: tinyGPT}, mb, n)
	mlp := newEvalProblem(t, "mlp", model.Config{Hidden: []int{32, 16}}, mb, n)
	cnn := newEvalProblem(t, "cnn", model.Config{}, mb, 9)
	for _, tc := range []struct {
		p     *evalProblem
		split Split
		micro []int
	}{
		{gpt, Split{0, 2, 5}, []int{1, 2, 4}},
		{gpt, Split{0, 1, 4, 5}, []int{1, 4}},
		{mlp, Split{0, 3, 5}, []int{2}},
		{cnn, Split{0, 4, 10}, []int{2}},
	} {
		for _, M := range tc.micro {
			t.Run(fmt.Sprintf("%s/%v/M=%d", tc.p.name, []int(tc.split), M), func(t *testing.T) {
				figures := evalPipeline(t, tc.p, tc.split, Config{Micro: M, Codec: "none"})
				for s, f := range figures {
					if f != figures[0] {
						t.Fatalf("stage %d reports %+v, stage 0 %+v", s, f, figures[0])
					}
				}
				got, ref := figures[0], tc.p.ref
				dl := math.Abs(got.Loss-ref.Loss) / ref.Loss
				t.Logf("loss %.9f (whole model %.9f, relative %.2g), accuracy %.4f", got.Loss, ref.Loss, dl, got.Accuracy())
				if dl > evalBound || got.Samples != ref.Samples || got.Correct != ref.Correct {
					t.Fatalf("pipeline %+v, whole model %+v: loss differs by %.3g relative (bound %g)", got, ref, dl, evalBound)
				}
			})
		}
	}
}

// TestEvaluateDeterministic: two pipelines with the same parameters
// report the same figures bit for bit under each activation codec,
// stochastic qsgd included, although their stages' seeds differ (the
// evaluation's codecs are seeded alike on every peer); a compressed
// codec's figures differ from none's, by little.
func TestEvaluateDeterministic(t *testing.T) {
	p := newEvalProblem(t, "gpt", model.Config{GPT: tinyGPT}, 4, 23)
	split := Split{0, 2, 4, 5}
	exact := evalPipeline(t, p, split, Config{Micro: 2, Codec: "none"})[0]
	for _, codec := range []string{"dyn8", "qsgd:bits=8"} {
		a := evalPipeline(t, p, split, Config{Micro: 2, Codec: codec, Seed: 1})[0]
		b := evalPipeline(t, p, split, Config{Micro: 2, Codec: codec, Seed: 100})[0]
		if a != b {
			t.Errorf("%s: two pipelines with the same parameters report %+v and %+v", codec, a, b)
		}
		dl := math.Abs(a.Loss-exact.Loss) / exact.Loss
		t.Logf("%s: loss %.6f, none's %.6f (relative %.2g)", codec, a.Loss, exact.Loss, dl)
		if a.Loss == exact.Loss || dl > 2e-2 {
			t.Errorf("%s: loss %v, none's %v: the codec is not applied, or wrongly", codec, a.Loss, exact.Loss)
		}
	}
}

// script is a Transport that answers Recv from a fixed list of messages
// and accepts every Send.
type script map[Key][]byte

func (s script) Send(context.Context, Key, []byte) error { return nil }
func (s script) Recv(ctx context.Context, k Key) ([]byte, error) {
	if p, ok := s[k]; ok {
		return p, nil
	}
	<-ctx.Done()
	return nil, fmt.Errorf("no %v: %w", k, context.Cause(ctx))
}

// TestEvaluateRefusesBadFigures: a stage refuses figures that count other
// labels than the rounds so far hold, more right than counted, or that
// have the wrong size, naming the message; a missing message fails when
// the context ends; an empty held-out set is an error.
func TestEvaluateRefusesBadFigures(t *testing.T) {
	p := newEvalProblem(t, "gpt", model.Config{GPT: tinyGPT}, 4, 6) // 2 chunks, 1 round of 2
	labels := 6 * tinyGPT.Context
	m, err := model.NewStage("gpt", p.cfg, gpu.NewCPU(0), 11, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	k := Key{Step: 5, Kind: EvalStats}
	for _, tc := range []struct {
		name, want string
		payload    []byte
	}{
		{"good", "", AppendEvalStats(nil, model.Stats{Loss: 3, Correct: 7, Samples: labels})},
		{"short", "of 23 bytes", AppendEvalStats(nil, model.Stats{Samples: labels})[:23]},
		{"labels", "counting 47 labels", AppendEvalStats(nil, model.Stats{Samples: labels - 1})},
		{"correct", "right", AppendEvalStats(nil, model.Stats{Correct: labels + 1, Samples: labels})},
		{"missing", "deadline", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := script{}
			if tc.payload != nil {
				tr[k] = tc.payload
			}
			st, err := NewStage(m, tr, Config{Stages: 2, Stage: 0, Micro: 2, Codec: "none"})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			got, err := st.Evaluate(ctx, 5, p.ds)
			if tc.want == "" {
				if err != nil || got != (model.Stats{Loss: 3, Correct: 7, Samples: labels}) {
					t.Fatalf("Evaluate = %+v, %v", got, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "eval stats") {
				t.Fatalf("Evaluate error %v, want one naming the eval stats message and %q", err, tc.want)
			}
		})
	}
	st, err := NewStage(m, script{}, Config{Stages: 2, Stage: 0, Micro: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Evaluate(context.Background(), 5, model.BatchSamples{}); err == nil || !strings.Contains(err.Error(), "0 samples") {
		t.Errorf("empty held-out set: %v", err)
	}
}

// TestEvaluateFailures: a neighbour lost mid-evaluation fails it on every
// stage: the sender with the transport's error, naming the chunk, the
// stage waiting for it when the evaluation's context ends (the trainer
// resets the pipeline, which ends every wait at once).
func TestEvaluateFailures(t *testing.T) {
	p := newEvalProblem(t, "gpt", model.Config{GPT: tinyGPT}, 4, 23)
	net := NewMemNetwork(2)
	stages := newStages(t, p.name, p.cfg, p.whole, Split{0, 2, 5}, net, Config{Micro: 2, Codec: "none"})
	stages[0].t = &failing{Transport: stages[0].t, left: 2}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for s, st := range stages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, errs[s] = st.Evaluate(ctx, 5, p.ds); errs[s] != nil {
				cancel() // the trainer resets the pipeline
			}
		}()
	}
	wg.Wait()
	cancel()
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "peer gone") || !strings.Contains(errs[0].Error(), "chunk 2 eval activation") {
		t.Errorf("stage 0: %v", errs[0])
	}
	if errs[1] == nil || !errors.Is(errs[1], context.Canceled) {
		t.Errorf("stage 1: %v", errs[1])
	}
}
