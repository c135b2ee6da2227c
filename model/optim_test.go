package model

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// refUpdate is the float64 reference of one optimizer step.
func refUpdate(cfg OptimConfig, p, g, m, v []float64, decay []bool, lr float64, step int64) {
	for i := range p {
		wd := 0.0
		if decay[i] {
			wd = cfg.WeightDecay
		}
		switch cfg.Name {
		case "sgd", "nesterov":
			gi := g[i] + wd*p[i]
			m[i] = cfg.Momentum*m[i] + gi
			d := m[i]
			if cfg.Name == "nesterov" {
				d = gi + cfg.Momentum*m[i]
			}
			p[i] -= lr * d
		case "adamw":
			t := float64(step + 1)
			m[i] = cfg.Beta1*m[i] + (1-cfg.Beta1)*g[i]
			v[i] = cfg.Beta2*v[i] + (1-cfg.Beta2)*g[i]*g[i]
			mh := m[i] / (1 - math.Pow(cfg.Beta1, t))
			vh := v[i] / (1 - math.Pow(cfg.Beta2, t))
			p[i] -= lr * (mh/(math.Sqrt(vh)+cfg.Eps) + wd*p[i])
		}
	}
}

func TestOptimizersMatchReference(t *testing.T) {
	const n = 50
	decaySpans := []span{{5, 20}, {30, 31}}
	decay := make([]bool, n)
	for _, s := range decaySpans {
		for i := s.lo; i < s.hi; i++ {
			decay[i] = true
		}
	}
	for _, cfg := range []OptimConfig{
		{Name: "sgd", LR: 0.1, Momentum: 0.9, WeightDecay: 0.01},
		{Name: "sgd", LR: 0.1, Momentum: -1},
		{Name: "nesterov", LR: 0.05, Momentum: 0.8, WeightDecay: 0.1},
		{Name: "adamw", LR: 0.01, WeightDecay: 0.05},
	} {
		t.Run(cfg.Name, func(t *testing.T) {
			o, err := newOptimizer(cfg, n, decaySpans)
			if err != nil {
				t.Fatal(err)
			}
			rc := o.Config()
			rng := rand.New(rand.NewPCG(1, 2))
			p := make([]float32, n)
			rp, rm, rv := make([]float64, n), make([]float64, n), make([]float64, n)
			for i := range p {
				p[i] = rng.Float32()*2 - 1
				rp[i] = float64(p[i])
			}
			for step := int64(0); step < 5; step++ {
				g := make([]float32, n)
				rg := make([]float64, n)
				for i := range g {
					g[i] = rng.Float32()*2 - 1
					rg[i] = float64(g[i])
				}
				o.Step(p, g, step)
				refUpdate(rc, rp, rg, rm, rv, decay, o.LR(step), step)
			}
			for i := range p {
				if math.Abs(float64(p[i])-rp[i]) > 1e-5 {
					t.Fatalf("param %d: %v, reference %v", i, p[i], rp[i])
				}
			}
		})
	}
}

func TestSchedule(t *testing.T) {
	o, err := newOptimizer(OptimConfig{LR: 1, WarmupSteps: 4, TotalSteps: 14, MinLR: 0.1}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		step int64
		want float64
	}{{0, 0.25}, {1, 0.5}, {3, 1}, {4, 1}, {9, 0.55}, {14, 0.1}, {100, 0.1}}
	for _, tc := range tests {
		if got := o.LR(tc.step); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("LR(%d) = %v, want %v", tc.step, got, tc.want)
		}
	}
	c, _ := newOptimizer(OptimConfig{LR: 0.3}, 1, nil)
	if c.LR(0) != 0.3 || c.LR(1e6) != 0.3 {
		t.Error("constant schedule is not constant")
	}
}

func TestClipping(t *testing.T) {
	o, _ := newOptimizer(OptimConfig{Name: "sgd", LR: 1, Momentum: -1, ClipNorm: 1}, 2, nil)
	p := []float32{0, 0}
	g := []float32{3, 4}
	info := o.Step(p, g, 0)
	if !info.Clipped || info.GradNorm != 5 {
		t.Fatalf("info %+v", info)
	}
	if math.Abs(float64(p[0])+0.6) > 1e-6 || math.Abs(float64(p[1])+0.8) > 1e-6 {
		t.Errorf("params %v, want [-0.6 -0.8]", p)
	}
	g = []float32{0.3, 0.4}
	if info := o.Step(p, g, 1); info.Clipped {
		t.Error("clipped a gradient below the limit")
	}
}

func TestOptimizerConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  OptimConfig
		text string
	}{
		{OptimConfig{Name: "lamb"}, "unknown optimizer \"lamb\" (valid: adamw, nesterov, sgd)"},
		{OptimConfig{Momentum: 1.5}, "momentum"},
		{OptimConfig{Name: "nesterov", Momentum: -1}, "nesterov needs"},
		{OptimConfig{Name: "adamw", Beta1: 1}, "betas"},
		{OptimConfig{LR: -1}, "learning rate"},
		{OptimConfig{WeightDecay: -1}, "must not be negative"},
		{OptimConfig{LR: 0.1, MinLR: 1, TotalSteps: 10}, "min lr"},
	} {
		if _, err := newOptimizer(tc.cfg, 1, nil); err == nil || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%+v: error %v, want one mentioning %q", tc.cfg, err, tc.text)
		}
	}
}

func TestOptimizerStateRoundTrip(t *testing.T) {
	for _, name := range OptimizerNames() {
		t.Run(name, func(t *testing.T) {
			const n = 40
			a, _ := newOptimizer(OptimConfig{Name: name}, n, nil)
			b, _ := newOptimizer(OptimConfig{Name: name}, n, nil)
			rng := rand.New(rand.NewPCG(3, 3))
			pa := make([]float32, n)
			grad := func() []float32 {
				g := make([]float32, n)
				for i := range g {
					g[i] = rng.Float32() - 0.5
				}
				return g
			}
			for s := int64(0); s < 3; s++ {
				a.Step(pa, grad(), s)
			}
			if err := b.SetState(a.State()); err != nil {
				t.Fatal(err)
			}
			pb := slices.Clone(pa)
			for s := int64(3); s < 6; s++ {
				g := grad()
				a.Step(pa, slices.Clone(g), s)
				b.Step(pb, g, s)
			}
			if HashFloats(pa) != HashFloats(pb) {
				t.Error("restored optimizer diverged")
			}
			st := a.State()
			other := "sgd"
			if name == "sgd" {
				other = "adamw"
			}
			c, _ := newOptimizer(OptimConfig{Name: other}, n, nil)
			d, _ := newOptimizer(OptimConfig{Name: name}, n+1, nil)
			for what, err := range map[string]error{
				"truncated":  b.SetState(st[:len(st)-1]),
				"no magic":   b.SetState(st[1:]),
				"other kind": c.SetState(st),
				"other size": d.SetState(st),
			} {
				if !errors.Is(err, ErrBadState) {
					t.Errorf("%s: error %v, want ErrBadState", what, err)
				}
			}
		})
	}
}

func TestInitIsPinnedAndBucketIndependent(t *testing.T) {
	dev := []gpu.Device{gpu.NewCPU(0)}
	a, err := New("mlp", Config{Hidden: []int{32, 16}}, dev, 123)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New("mlp", Config{Hidden: []int{32, 16}, BucketBytes: 512}, dev, 123)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := New("mlp", Config{Hidden: []int{32, 16}}, dev, 124)
	if len(b.Buckets()) <= len(a.Buckets()) {
		t.Fatalf("small buckets gave %d buckets vs %d", len(b.Buckets()), len(a.Buckets()))
	}
	if a.ParamHash() != b.ParamHash() {
		t.Error("bucket size changed the initial parameters")
	}
	if a.ParamHash() == c.ParamHash() {
		t.Error("different seeds gave the same parameters")
	}
	// Pinned: initialisation must not change between builds or Go versions,
	// or peers running different builds would start apart.
	if h := a.ParamHash(); h != pinnedInitHash {
		t.Errorf("initial hash %s, want %s", h, pinnedInitHash)
	}
	for _, m := range []*Model{a, b, c} {
		m.Close()
	}
}

var pinnedInitHash = "73130ba4f228f8c5b6a6e0512062c4bfe17d4cc85f6552603c21971bd1ddc600"

func TestCheckpoints(t *testing.T) {
	dir := t.TempDir()
	m, err := New("mlp", Config{Hidden: []int{16}}, []gpu.Device{gpu.NewCPU(0)}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	o, _ := NewOptimizer(OptimConfig{Name: "adamw"}, m)
	hash := ConfigHash(m.Signature(), "adamw", "seed=1")
	if _, err := LoadLatestCheckpoint(dir, &hash); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty dir: %v", err)
	}
	if _, err := LoadLatestCheckpoint(filepath.Join(dir, "absent"), &hash); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("missing dir: %v", err)
	}
	ds := synthetic(4, 64)
	var hashes []string
	for step := int64(0); step < 5; step++ {
		if _, err := m.ComputeGradients([]Batch{ds.Slice(int(step)*8, int(step)*8+8)}, 0, nil); err != nil {
			t.Fatal(err)
		}
		m.ApplyGradients(o, step)
		if _, err := WriteCheckpoint(dir, m.Checkpoint(o, step+1, hash), 2); err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, m.ParamHash())
	}
	steps, _ := listCheckpoints(dir)
	if !slices.Equal(steps, []int64{4, 5}) {
		t.Fatalf("kept checkpoints %v, want [4 5]", steps)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Fatalf("%d files left (temp files?)", len(ents))
	}

	// Resume into a fresh model: same parameters, and the next step agrees
	// with the uninterrupted run.
	c, err := LoadLatestCheckpoint(dir, &hash)
	if err != nil {
		t.Fatal(err)
	}
	if c.Step != 5 {
		t.Fatalf("latest step %d", c.Step)
	}
	m2, _ := New("mlp", Config{Hidden: []int{16}}, []gpu.Device{gpu.NewCPU(0)}, 99)
	defer m2.Close()
	o2, _ := NewOptimizer(OptimConfig{Name: "adamw"}, m2)
	if err := m2.Restore(c, o2); err != nil {
		t.Fatal(err)
	}
	if m2.ParamHash() != hashes[4] {
		t.Fatal("restored parameters differ")
	}
	if err := m2.CheckReplicas(); err != nil {
		t.Fatal(err)
	}
	for _, mm := range []struct {
		m *Model
		o *Optimizer
	}{{m, o}, {m2, o2}} {
		mm.m.ComputeGradients([]Batch{ds.Slice(40, 48)}, 0, nil)
		mm.m.ApplyGradients(mm.o, 5)
	}
	if m.ParamHash() != m2.ParamHash() {
		t.Fatal("resumed run diverged from the uninterrupted one")
	}

	// Mismatched configuration.
	other := ConfigHash("something else")
	if _, err := LoadLatestCheckpoint(dir, &other); !errors.Is(err, ErrCheckpointMismatch) {
		t.Errorf("mismatch: %v", err)
	}
	// Corrupt and truncated files are errors, never a silent fallback.
	p := CheckpointPath(dir, 5)
	good, _ := os.ReadFile(p)
	bad := slices.Clone(good)
	bad[100] ^= 1
	for what, b := range map[string][]byte{"flipped bit": bad, "truncated": good[:len(good)-10], "empty": nil} {
		os.WriteFile(p, b, 0o644)
		if _, err := LoadLatestCheckpoint(dir, &hash); !errors.Is(err, ErrBadCheckpoint) {
			t.Errorf("%s: %v", what, err)
		}
	}
	// A checkpoint of another model size is refused by Restore.
	small := &Checkpoint{Params: make([]byte, 8), Optimizer: o.State()}
	if err := m.Restore(small, o); !errors.Is(err, ErrBadState) {
		t.Errorf("wrong size restore: %v", err)
	}
}

// TestTimeOptimizerStepLeavesTheModel: timing an optimizer's step returns
// a positive time per parameter and leaves the model's parameters and
// gradients as they were; no repetitions, or an unknown optimizer, is an
// error.
func TestTimeOptimizerStepLeavesTheModel(t *testing.T) {
	m, err := New("mlp", Config{Hidden: []int{16}}, []gpu.Device{gpu.NewCPU(0)}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i := range m.Grads() {
		m.Grads()[i] = 0.5
	}
	params, grads := slices.Clone(m.Params()), slices.Clone(m.Grads())
	for _, name := range OptimizerNames() {
		s, err := TimeOptimizerStep(OptimConfig{Name: name, WeightDecay: 0.1}, m, 3)
		if err != nil || !(s > 0) || math.IsInf(s, 0) {
			t.Errorf("%s: %g s per parameter, %v", name, s, err)
		}
	}
	if !slices.Equal(params, m.Params()) || !slices.Equal(grads, m.Grads()) {
		t.Error("timing the optimizer changed the model's parameters or gradients")
	}
	if _, err := TimeOptimizerStep(OptimConfig{Name: "adamw"}, m, 0); err == nil {
		t.Error("no repetitions were accepted")
	}
	if _, err := TimeOptimizerStep(OptimConfig{Name: "lion"}, m, 1); err == nil {
		t.Error("an unknown optimizer was accepted")
	}
}
