package data_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
)

// BenchmarkFashionMNISTEpoch trains the mlp (or $P2PTRAIN_MODEL) for one
// epoch (or $P2PTRAIN_EPOCHS, with $P2PTRAIN_OPT and $P2PTRAIN_LR) on the real
// data, one process drawing the four ranks' shards of a global batch of 64×4,
// and reports the test accuracy and samples/s. Slow: run it alone with
// go test -run '^$' -bench FashionMNISTEpoch -benchtime 1x ./data
func BenchmarkFashionMNISTEpoch(b *testing.B) {
	train, test, err := data.LoadFashionMNIST("")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		fashionEpoch(b, train, test)
	}
}

func fashionEpoch(t *testing.B, train, test *data.Dataset) {
	name := os.Getenv("P2PTRAIN_MODEL")
	if name == "" {
		name = "mlp"
	}
	const batch, world = 64, 4
	m, err := model.New(name, model.Config{MaxBatch: batch * world}, []gpu.Device{gpu.NewCPU(0)}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	epochs := 1
	if e, err := strconv.Atoi(os.Getenv("P2PTRAIN_EPOCHS")); err == nil && e > 0 {
		epochs = e
	}
	steps := int64(epochs * train.Len() / (batch * world))
	lr := 0.05
	if v, err := strconv.ParseFloat(os.Getenv("P2PTRAIN_LR"), 64); err == nil {
		lr = v
	}
	opt, err := model.NewOptimizer(model.OptimConfig{Name: os.Getenv("P2PTRAIN_OPT"), LR: lr, WarmupSteps: 20, TotalSteps: steps, WeightDecay: 5e-4}, m)
	if err != nil {
		t.Fatal(err)
	}
	smp := data.NewSampler(3, train.Len())
	var idx []int
	bt := model.Batch{}
	start := time.Now()
	for step := int64(0); step < steps; step++ {
		// The four ranks' shards together form the global batch.
		idx = idx[:0]
		for r := 0; r < world; r++ {
			part, err := smp.Indices(nil, step, r, world, batch)
			if err != nil {
				t.Fatal(err)
			}
			idx = append(idx, part...)
		}
		bt = train.Gather(bt, idx)
		st, err := m.ComputeGradients([]model.Batch{bt}, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		m.ApplyGradients(opt, step)
		if step%100 == 0 {
			t.Logf("step %d loss %.4f acc %.3f", step, st.Loss, st.Accuracy())
		}
	}
	el := time.Since(start)
	ev, err := m.Evaluate(test)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s %s lr=%g: %d epoch(s) (%d steps of %d) in %v: test loss %.4f",
		name, opt.Config().Name, lr, epochs, steps, batch*world, el.Round(time.Second), ev.Loss)
	t.ReportMetric(ev.Accuracy(), "test_accuracy")
	t.ReportMetric(float64(steps)*batch*world/el.Seconds(), "samples/s")
}
