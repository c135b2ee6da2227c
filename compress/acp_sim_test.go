package compress

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
)

// BenchmarkLowRankTraining trains the trainer's default mlp on Fashion-MNIST as 4
// peers do (same model, optimizer, sampler and codec seeds; fp32 all-reduce for
// the first warm-up steps, then the codec with its factors summed over the
// peers), in one process without a network, and reports each codec's final
// test accuracy and its difference from the first codec's. An experiment,
// not a check; LOWRANK_TRAIN lists the codecs (default "none powersgd:rank=4
// acpsgd:rank=4"), one run taking about a minute:
//
//	LOWRANK_TRAIN_PERMS=3 go test ./compress/ -run '^$' -bench LowRankTraining -benchtime 1x -timeout 0
//
// LOWRANK_TRAIN_STEPS (1000), LOWRANK_TRAIN_WARMUP (steps in fp32 before the
// codec, 50) and LOWRANK_TRAIN_LR_WARMUP (50) change the schedule. The
// aggregate of the low-rank codecs is linear in the peers' gradients, so real
// runs differ only in floating-point order: LOWRANK_TRAIN_PERMS > 1 repeats each
// codec with other orders of summing the peers, to show that spread.
// LOWRANK_TRAIN_RESET_AT="350 950" calls ResetShared at those steps, as the
// trainer does at every ring-epoch change (a re-plan mid-run makes one).
// LOWRANK_TRAIN_ALIGN=1 also logs, per matrix and 100 steps, the mean cosine
// between the codec's averaged gradient and the exact fp32 average.
func BenchmarkLowRankTraining(b *testing.B) {
	specs := strings.Fields(os.Getenv("LOWRANK_TRAIN"))
	if len(specs) == 0 {
		specs = []string{"none", "powersgd:rank=4", "acpsgd:rank=4"}
	}
	train, test, err := data.LoadFashionMNIST("")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		lowRankTraining(b, specs, train, test)
	}
}

func lowRankTraining(t *testing.B, specs []string, train, test *data.Dataset) {
	cfg := simConfig{
		steps:    envInt(t, "LOWRANK_TRAIN_STEPS", 1000),
		warmup:   envInt(t, "LOWRANK_TRAIN_WARMUP", 50),
		lrWarmup: envInt(t, "LOWRANK_TRAIN_LR_WARMUP", 50),
		align:    os.Getenv("LOWRANK_TRAIN_ALIGN") != "",
	}
	for _, f := range strings.Fields(os.Getenv("LOWRANK_TRAIN_RESET_AT")) {
		s, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("LOWRANK_TRAIN_RESET_AT: %v", err)
		}
		cfg.resets = append(cfg.resets, s)
	}
	perms := envInt(t, "LOWRANK_TRAIN_PERMS", 1)
	base := make([]float64, perms)
	for si, spec := range specs {
		var sum float64
		for p := range perms {
			acc := simTrain(t, spec, cfg, train, test, uint64(p))
			if si == 0 {
				base[p] = acc
			}
			sum += acc - base[p]
			t.Logf("%-18s order %d: accuracy %.2f%% (%+.2f pp)", spec, p, 100*acc, 100*(acc-base[p]))
		}
		t.Logf("%-18s mean Δ %+.2f pp over %d runs", spec, 100*sum/float64(perms), perms)
		t.ReportMetric(100*sum/float64(perms), "pp_"+spec)
	}
}

func envInt(t testing.TB, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

type simConfig struct {
	steps, warmup, lrWarmup int
	resets                  []int // steps before which ResetShared runs
	align                   bool
}

// simTrain runs one training with spec, the peers summed in the order that
// perm picks, and returns the test accuracy.
func simTrain(t testing.TB, spec string, cfg simConfig, train, test *data.Dataset, perm uint64) float64 {
	const world, per, seed = 4, 64, 1
	m, err := model.New("mlp", model.Config{Hidden: []int{1024, 1024}, BucketBytes: 25 << 20, MaxBatch: per},
		[]gpu.Device{gpu.NewCPU(0)}, seed)
	if err != nil {
		t.Fatal(err)
	}
	opt, err := model.NewOptimizer(model.OptimConfig{Name: "sgd", LR: 0.05, Momentum: 0.9,
		WarmupSteps: int64(cfg.lrWarmup), TotalSteps: int64(cfg.steps)}, m)
	if err != nil {
		t.Fatal(err)
	}
	smp := data.NewSampler(seed, train.Len())
	buckets := m.Buckets()
	codecs := make([][]Codec, world) // [rank][bucket], seeded as node.NewTrainer does
	for r := range codecs {
		for _, b := range buckets {
			codecs[r] = append(codecs[r], mustNew(t, spec, Options{Layout: Layout{Shapes: b.Shapes()},
				SharedSeed: seed ^ uint64(b.Index+1)*0x9e3779b97f4a7c15}))
		}
	}
	order := []int{0, 1, 2, 3}
	for rng := rand.New(rand.NewPCG(perm, 7)); perm > 0 && slices.IsSorted(order); {
		rng.Shuffle(world, func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	grads := make([][]float32, world)
	mean := make([]float32, m.NumParams())
	cos, counted := map[string]float64{}, 0
	var idx []int
	batch := make([]model.Batch, 1)
	for step := range cfg.steps {
		if slices.Contains(cfg.resets, step) {
			for _, cs := range codecs {
				for _, c := range cs {
					if lr, ok := c.(LowRank); ok {
						lr.ResetShared()
					}
				}
			}
		}
		clear(mean)
		for r := range world {
			if idx, err = smp.Indices(idx, int64(step), r, world, per); err != nil {
				t.Fatal(err)
			}
			batch[0] = train.Gather(batch[0], idx)
			if _, err := m.ComputeGradients(batch, model.NoiseSeed(seed, int64(step), r), nil); err != nil {
				t.Fatal(err)
			}
			grads[r] = append(grads[r][:0], m.Grads()...)
		}
		for _, r := range order {
			for k, x := range grads[r] {
				mean[k] += x / world
			}
		}
		for b, bk := range buckets {
			out := m.BucketGrads(b)
			if _, ok := codecs[0][b].(LowRank); !ok || step < cfg.warmup {
				copy(out, mean[bk.Offset:bk.Offset+bk.Len])
				continue
			}
			simReduce(t, codecs, b, bk, grads, order, out)
		}
		if cfg.align && step >= cfg.warmup {
			simAlign(cos, buckets, m.Grads(), mean)
			if counted++; (step+1)%100 == 0 || step+1 == cfg.steps {
				for _, k := range slices.Sorted(maps.Keys(cos)) {
					fmt.Fprintf(os.Stderr, "  %s order %d steps %d–%d: %s cos(sent, fp32 mean) %.3f\n",
						spec, perm, step+2-counted, step+1, k, cos[k]/float64(counted))
				}
				clear(cos)
				counted = 0
			}
		}
		m.ApplyGradients(opt, int64(step))
	}
	st, err := m.Evaluate(test)
	if err != nil {
		t.Fatal(err)
	}
	return st.Accuracy()
}

// simReduce runs the rounds of bucket b's low-rank codecs, the peers' factors
// summed in order, and writes peer 0's averaged gradient (all agree) into out.
func simReduce(t testing.TB, codecs [][]Codec, b int, bk model.Bucket, grads [][]float32, order []int, out []float32) {
	world := len(codecs)
	lr := codecs[0][b].(LowRank)
	fs := make([][]float32, world)
	for round := range lr.Rounds() {
		for r := range world {
			var g []float32
			if round == 0 {
				g = grads[r][bk.Offset : bk.Offset+bk.Len]
			}
			var err error
			if fs[r], err = codecs[r][b].(LowRank).Factor(round, 0, g); err != nil {
				t.Fatal(err)
			}
		}
		sum := make([]float32, len(fs[0]))
		for _, r := range order {
			for k, x := range fs[r] {
				sum[k] += x
			}
		}
		for r := range world {
			o := out
			if r > 0 {
				o = make([]float32, len(out))
			}
			if err := codecs[r][b].(LowRank).Absorb(round, sum, world, o); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// simAlign adds, per matrix, the cosine between the sent gradient and the fp32 mean.
func simAlign(cos map[string]float64, buckets []model.Bucket, sent, mean []float32) {
	for _, bk := range buckets {
		for _, tn := range bk.Tensors {
			if len(tn.Matrix) < 2 {
				continue
			}
			var ss, mm, sm float64
			for k := bk.Offset + tn.Offset; k < bk.Offset+tn.Offset+tn.Len; k++ {
				s, x := float64(sent[k]), float64(mean[k])
				ss, mm, sm = ss+s*s, mm+x*x, sm+s*x
			}
			cos[fmt.Sprint(tn.Matrix)] += sm / math.Sqrt(ss*mm)
		}
	}
}
