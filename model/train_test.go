package model

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/gpu"
)

// synthetic makes n samples of a learnable 10-class problem: each class has
// a fixed random prototype image; a sample is its prototype plus noise.
func synthetic(seed uint64, n int) *samples {
	rng := rand.New(rand.NewPCG(seed, 1))
	proto := make([][]float32, 10)
	pr := rand.New(rand.NewPCG(99, 99)) // prototypes shared by all splits
	for c := range proto {
		proto[c] = make([]float32, 784)
		for i := range proto[c] {
			proto[c][i] = float32(pr.NormFloat64())
		}
	}
	ds := &samples{x: make([]float32, n*784), y: make([]uint8, n)}
	for s := 0; s < n; s++ {
		c := rng.IntN(10)
		ds.y[s] = uint8(c)
		for i := 0; i < 784; i++ {
			ds.x[s*784+i] = proto[c][i] + 1.5*float32(rng.NormFloat64())
		}
	}
	return ds
}

// samples is an in-memory sample set of 28×28 images (package data's
// Dataset, which imports this package, in miniature).
type samples struct {
	x []float32
	y []uint8
}

func (s *samples) Len() int       { return len(s.y) }
func (s *samples) SampleLen() int { return 784 }
func (s *samples) Slice(lo, hi int) Batch {
	return Batch{X: s.x[lo*784 : hi*784], Y: s.y[lo:hi]}
}
func (s *samples) Subset(n int) *samples { return &samples{x: s.x[:n*784], y: s.y[:n]} }

// Gather copies the samples at idx into dst.
func (s *samples) Gather(dst Batch, idx []int) Batch {
	dst.X, dst.Y = dst.X[:0], dst.Y[:0]
	for _, k := range idx {
		dst.X = append(dst.X, s.x[k*784:(k+1)*784]...)
		dst.Y = append(dst.Y, s.y[k])
	}
	return dst
}

// trainRun trains name for steps steps of batch on ds with one replica per
// device and returns the first and last few steps' mean loss and the hash.
func trainRun(t testing.TB, name string, cfg Config, devs int, ds *samples, steps, batch int, oc OptimConfig) (first, last float64, hash string, m *Model) {
	var ds_ []gpu.Device
	for i := 0; i < devs; i++ {
		ds_ = append(ds_, gpu.NewCPU(i))
	}
	m, err := New(name, cfg, ds_, 42)
	if err != nil {
		t.Fatal(err)
	}
	opt, err := NewOptimizer(oc, m)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	var idx []int
	batches := make([]Batch, devs)
	const window = 5
	for step := int64(0); step < int64(steps); step++ {
		idx = idx[:0]
		for range batch * devs {
			idx = append(idx, rng.IntN(ds.Len()))
		}
		for d := range batches {
			batches[d] = ds.Gather(batches[d], idx[d*batch:(d+1)*batch])
		}
		st, err := m.ComputeGradients(batches, NoiseSeed(42, step, 0), nil)
		if err != nil {
			t.Fatal(err)
		}
		if step < window {
			first += st.Loss / window
		}
		if step >= int64(steps-window) {
			last += st.Loss / window
		}
		m.ApplyGradients(opt, step)
	}
	return first, last, m.ParamHash(), m
}

func TestTrainingLossFallsDeterministically(t *testing.T) {
	ds := synthetic(1, 2000)
	tests := []struct {
		name string
		cfg  Config
		devs int
		oc   OptimConfig
	}{
		{"mlp", Config{Hidden: []int{64, 32}, MaxBatch: 32}, 1, OptimConfig{Name: "sgd", LR: 0.02}},
		{"mlp", Config{Hidden: []int{64, 32}, MaxBatch: 32, Dropout: 0.2}, 2, OptimConfig{Name: "nesterov", LR: 0.02, WeightDecay: 1e-4, ClipNorm: 5}},
		{"mlp", Config{Hidden: []int{64}, MaxBatch: 32}, 1, OptimConfig{Name: "adamw", LR: 1e-3, WeightDecay: 0.01, WarmupSteps: 5, TotalSteps: 40}},
	}
	for _, tc := range tests {
		t.Run(tc.name+"_"+tc.oc.Name, func(t *testing.T) {
			first, last, h1, m := trainRun(t, tc.name, tc.cfg, tc.devs, ds, 40, 16, tc.oc)
			defer m.Close()
			if !(last < 0.6*first) {
				t.Errorf("loss went from %.4f to %.4f: not falling", first, last)
			}
			if err := m.CheckReplicas(); err != nil {
				t.Error(err)
			}
			_, _, h2, m2 := trainRun(t, tc.name, tc.cfg, tc.devs, ds, 40, 16, tc.oc)
			defer m2.Close()
			if h1 != h2 {
				t.Errorf("two identical runs ended with hashes %s and %s", h1, h2)
			}
		})
	}
}

// TestMultiDeviceMatchesSingle checks that two replicas with half batches
// compute (up to rounding) the gradient one replica computes on the whole.
func TestMultiDeviceMatchesSingle(t *testing.T) {
	ds := synthetic(2, 64)
	cfg := Config{Hidden: []int{32}, MaxBatch: 16, BucketBytes: 4096}
	one, err := New("mlp", cfg, []gpu.Device{gpu.NewCPU(0)}, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	two, err := New("mlp", cfg, []gpu.Device{gpu.NewCPU(0), gpu.NewCPU(1)}, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer two.Close()
	if one.ParamHash() != two.ParamHash() {
		t.Fatal("same seed, different initial parameters")
	}
	var order1, order2 []int
	s1, err := one.ComputeGradients([]Batch{ds.Slice(0, 16)}, 1, func(b int) { order1 = append(order1, b) })
	if err != nil {
		t.Fatal(err)
	}
	s2, err := two.ComputeGradients([]Batch{ds.Slice(0, 8), ds.Slice(8, 16)}, 1, func(b int) { order2 = append(order2, b) })
	if err != nil {
		t.Fatal(err)
	}
	if len(order1) != len(one.Buckets()) || len(order1) < 2 {
		t.Fatalf("ready order %v for %d buckets", order1, len(one.Buckets()))
	}
	for i := range order1 {
		if order1[i] != i || order2[i] != i {
			t.Fatalf("ready order %v / %v, want 0, 1, 2, …", order1, order2)
		}
	}
	if math.Abs(s1.Loss-s2.Loss) > 1e-5 || s1.Correct != s2.Correct || s1.Samples != s2.Samples {
		t.Errorf("stats %+v vs %+v", s1, s2)
	}
	for i, g := range one.Grads() {
		if d := math.Abs(float64(g - two.Grads()[i])); d > 1e-6+1e-4*math.Abs(float64(g)) {
			t.Fatalf("grad %d: %v on one device, %v on two", i, g, two.Grads()[i])
		}
	}
}

func TestComputeGradientsRejectsBadBatches(t *testing.T) {
	m, err := New("mlp", Config{Hidden: []int{8}, MaxBatch: 4}, []gpu.Device{gpu.NewCPU(0)}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	good := randomBatch(rand.New(rand.NewPCG(1, 1)), 2)
	tests := []struct {
		name    string
		batches []Batch
	}{
		{"too many batches", []Batch{good, good}},
		{"empty", []Batch{{}}},
		{"too large", []Batch{randomBatch(rand.New(rand.NewPCG(1, 1)), 5)}},
		{"short X", []Batch{{X: good.X[:100], Y: good.Y}}},
		{"bad label", []Batch{{X: good.X, Y: []uint8{3, 10}}}},
	}
	for _, tc := range tests {
		if _, err := m.ComputeGradients(tc.batches, 0, nil); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func benchStep(b *testing.B, name string, batch int) {
	m, err := New(name, Config{MaxBatch: batch}, []gpu.Device{gpu.NewCPU(0)}, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	opt, _ := NewOptimizer(OptimConfig{Name: "sgd", LR: 0.01}, m)
	bt := randomBatch(rand.New(rand.NewPCG(1, 2)), batch)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := m.ComputeGradients([]Batch{bt}, 0, nil); err != nil {
			b.Fatal(err)
		}
		m.ApplyGradients(opt, int64(i))
	}
	b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "samples/s")
}

// BenchmarkStepMLP64 measures a full training step (forward, backward,
// SGD update, replica sync) of the default mlp at batch 64 on one CPU device.
func BenchmarkStepMLP64(b *testing.B) { benchStep(b, "mlp", 64) }

// BenchmarkStepCNN64 is BenchmarkStepMLP64 for the cnn.
func BenchmarkStepCNN64(b *testing.B) { benchStep(b, "cnn", 64) }

// TestEvaluate checks that evaluation over several replicas and partial
// batches agrees with one replica, and that errors are reported.
func TestEvaluate(t *testing.T) {
	ds := synthetic(3, 103)
	cfg := Config{Hidden: []int{32}, MaxBatch: 16}
	one, _ := New("mlp", cfg, []gpu.Device{gpu.NewCPU(0)}, 5)
	defer one.Close()
	two, _ := New("mlp", cfg, []gpu.Device{gpu.NewCPU(0), gpu.NewCPU(1)}, 5)
	defer two.Close()
	a, err := one.Evaluate(ds)
	if err != nil {
		t.Fatal(err)
	}
	b, err := two.Evaluate(ds)
	if err != nil {
		t.Fatal(err)
	}
	if a.Samples != 103 || b.Samples != 103 || a.Correct != b.Correct || math.Abs(a.Loss-b.Loss) > 1e-9 {
		t.Errorf("one device %+v, two devices %+v", a, b)
	}
	if _, err := one.Evaluate(ds.Subset(0)); err == nil {
		t.Error("evaluating an empty dataset succeeded")
	}
}
