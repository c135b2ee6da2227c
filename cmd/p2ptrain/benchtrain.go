package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"

	// The CUDA device registers itself with gpu.Open for "cuda" specs: this
	// import links it into the binary, for join's train.devices as much as
	// for bench train.
	_ "github.com/p2ptrain/p2ptrain/gpu/cuda/cudadev"
)

// trainBenchResult is one device set's measurement.
type trainBenchResult struct {
	Devices        []string `json:"devices"`
	Model          string   `json:"model"`
	BatchPerDevice int      `json:"batch_per_device"`
	Steps          int      `json:"steps"`
	Data           string   `json:"data"`
	SamplesPerS    float64  `json:"samples_per_s"`
	StepMS         float64  `json:"step_ms"`
	FirstLoss      float64  `json:"first_loss"`
	LastLoss       float64  `json:"last_loss"`
}

// cmdBenchTrain runs `p2ptrain bench train`: local training steps (forward,
// backward, the host optimizer and the copy of the parameters back to every
// device) on each device set given, without peers, and prints samples/s.
// Sizes the configuration refuses (train.batch_size above 4096 …) and sets
// that would not fit in memory are usage errors; SIGINT or SIGTERM stops
// it at once.
func cmdBenchTrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench train", stdout)
	var sets stringList
	fs.Var(&sets, "devices", "comma-separated device `SPECS` trained together, e.g. cpu, cuda (every GPU) or cuda:0,cuda:1; "+
		"repeat the flag to measure several sets (default cpu)")
	name := fs.String("model", "mlp", "`MODEL`: "+strings.Join(model.Names(), " or "))
	batch := fs.Int("batch-size", 256, "samples per device per step (`N`), as train.batch_size")
	steps := fs.Int("steps", 20, "timed `STEPS`, after --warmup untimed ones")
	warmup := fs.Int("warmup", 2, "untimed `STEPS` first (kernel compilation, allocation, caches)")
	data := fs.String("data", "auto", "`DATA`: fashion (Fashion-MNIST), synthetic (random images; random bytes for gpt), "+
		"or auto (fashion when found; for gpt the Go standard library's source when found)")
	asJSON := fs.Bool("json", false, "print a JSON list of {devices, model, batch_per_device, steps, data, samples_per_s, step_ms, first_loss, last_loss}")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	const cmd = "bench train"
	switch {
	case *steps <= 0:
		return usagef("%s: --steps must be positive, got %d", cmd, *steps)
	case *warmup < 0:
		return usagef("%s: --warmup must not be negative, got %d", cmd, *warmup)
	}
	if len(sets) == 0 {
		sets = stringList{"cpu"}
	}
	// The bounds of train.batch_size and train.model, and each set's
	// devices as train.devices; then whether each set fits in memory.
	given := setFlags(fs)
	deviceSets := make([][]string, len(sets))
	for k, set := range sets {
		specs := strings.Split(set, ",")
		for i := range specs {
			specs[i] = strings.TrimSpace(specs[i])
		}
		deviceSets[k] = specs
		if err := flagLimits(cmd, func(c *config.Config) {
			c.Train.BatchSize, c.Train.Model, c.Train.Devices = *batch, *name, specs
		}, flagLimit{"train.batch_size", "--batch-size", fromDefault(given["batch-size"])},
			flagLimit{"train.model", "--model", fromDefault(given["model"])}, flagLimit{"train.devices", "--devices " + set, fromDefault(given["devices"])}); err != nil {
			return err
		}
		// A device this machine lacks is a usage error, as join's preflight has it.
		if err := checkDevices(specs); err != nil {
			return usagef("%s: --devices %s: %v", cmd, set, err)
		}
	}
	for k, specs := range deviceSets {
		need, _, err := modelBytes(*name, model.Config{}, *batch, cpuDevices(specs))
		if err != nil {
			return usagef("%s: --model %s: %v", cmd, *name, err)
		}
		what := fmt.Sprintf("--model %s --batch-size %d --devices %s", *name, *batch, sets[k])
		if err := checkMemory(cmd, what, need, modelMemory, "lower --batch-size"); err != nil {
			return err
		}
	}
	var results []trainBenchResult
	for k, specs := range deviceSets {
		var r trainBenchResult
		err := interruptible(ctx, func() (err error) {
			r, err = benchTrain(ctx, specs, *name, *batch, *warmup, *steps, *data)
			return err
		})
		if interrupted(ctx, stderr, cmd) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("bench train --devices %s: %w", sets[k], err)
		}
		results = append(results, r)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICES\tMODEL\tBATCH/DEV\tSTEPS\tDATA\tSAMPLES/S\tSTEP\tLOSS")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%.0f\t%.2f ms\t%.3f → %.3f\n", strings.Join(r.Devices, ","), r.Model,
			r.BatchPerDevice, r.Steps, r.Data, r.SamplesPerS, r.StepMS, r.FirstLoss, r.LastLoss)
	}
	return tw.Flush()
}

// benchTrain measures one device set.
func benchTrain(ctx context.Context, specs []string, name string, batch, warmup, steps int, source string) (trainBenchResult, error) {
	r := trainBenchResult{Model: name, BatchPerDevice: batch, Steps: steps}
	devs, err := gpu.OpenAll(specs)
	if err != nil {
		return r, err
	}
	defer gpu.CloseAll(devs)
	for _, d := range devs {
		r.Devices = append(r.Devices, d.Name())
	}
	var ds benchSource
	var kind string
	if name == "gpt" {
		ds, kind, err = benchText(source, batch*len(devs))
	} else {
		ds, kind, err = benchData(source, batch*len(devs))
	}
	if err != nil {
		return r, err
	}
	r.Data = kind
	m, err := model.New(name, model.Config{MaxBatch: batch}, devs, 1)
	if err != nil {
		return r, err
	}
	defer m.Close()
	opt, err := model.NewOptimizer(model.OptimConfig{Name: "sgd", LR: 0.05, Momentum: 0.9}, m)
	if err != nil {
		return r, err
	}
	smp := data.NewSampler(1, ds.Len())
	batches := make([]model.Batch, len(devs))
	var idx []int
	var start time.Time
	for step := range warmup + steps {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		if step == warmup {
			start = time.Now()
		}
		if idx, err = smp.Indices(idx, int64(step), 0, 1, batch*len(devs)); err != nil {
			return r, err
		}
		for d := range batches {
			batches[d] = ds.Gather(batches[d], idx[d*batch:(d+1)*batch])
		}
		st, err := m.ComputeGradients(batches, model.NoiseSeed(1, int64(step), 0), nil)
		if err != nil {
			return r, err
		}
		m.ApplyGradients(opt, int64(step))
		if step == 0 {
			r.FirstLoss = st.Loss
		}
		r.LastLoss = st.Loss
	}
	elapsed := time.Since(start).Seconds()
	var errs []error
	for _, d := range devs {
		errs = append(errs, d.Synchronize())
	}
	if err := errors.Join(errs...); err != nil {
		return r, err
	}
	r.StepMS = elapsed / float64(steps) * 1e3
	r.SamplesPerS = float64(steps*batch*len(devs)) / elapsed
	return r, nil
}

// benchSource is what bench train draws its batches from: Fashion-MNIST or
// random images (*data.Dataset), or a text corpus's windows for gpt
// (*data.TextWindows).
type benchSource interface {
	Len() int
	Gather(dst model.Batch, idx []int) model.Batch
}

// benchText returns the gpt's training windows (the model's default context)
// from the text source names ("synthetic" or "auto"), with at least n
// windows, and which it is.
func benchText(source string, n int) (*data.TextWindows, string, error) {
	opts := data.TextOptions{HeldOut: data.DefaultHeldOut, Context: model.DefaultGPTContext}
	switch source {
	case "auto":
		c, err := data.LoadGoSource(opts)
		if err == nil && c.Train(1).Len() >= n {
			return c.Train(1), "go-source", nil
		}
	case "synthetic":
	case "fashion":
		return nil, "", usagef("--data fashion is images; gpt trains on text (--data synthetic or auto)")
	default:
		return nil, "", usagef("--data %q (want fashion, synthetic or auto)", source)
	}
	// Random bytes, enough for n windows of context+1 after the held-out
	// share: a step's speed does not depend on the text.
	rng := rand.New(rand.NewPCG(1, 2))
	text := make([]byte, 2*max(n, 64)*(opts.Context+1))
	for i := range text {
		text[i] = byte(rng.UintN(256))
	}
	c, err := data.NewTextCorpus(text, opts)
	if err != nil {
		return nil, "", err
	}
	return c.Train(1), "synthetic", nil
}

// benchData returns the training set source names ("fashion", "synthetic"
// or "auto") with at least n samples, and which it is.
func benchData(source string, n int) (*data.Dataset, string, error) {
	switch source {
	case "fashion", "auto":
		train, _, err := data.LoadFashionMNIST("")
		if err == nil && train.Len() >= n {
			return train, "fashion", nil
		}
		if source == "fashion" {
			if err == nil {
				err = fmt.Errorf("Fashion-MNIST has %d samples, fewer than one step's %d", train.Len(), n)
			}
			return nil, "", err
		}
		fallthrough
	case "synthetic":
		return syntheticData(max(n, 1024)), "synthetic", nil
	}
	return nil, "", usagef("--data %q (want fashion, synthetic or auto)", source)
}

// syntheticData makes n random 28×28 images with random labels: the speed
// of a step does not depend on what the pixels are.
func syntheticData(n int) *data.Dataset {
	rng := rand.New(rand.NewPCG(1, 2))
	img := make([]byte, n*28*28)
	for i := range img {
		img[i] = byte(rng.UintN(256))
	}
	lab := make([]byte, n)
	for i := range lab {
		lab[i] = byte(rng.UintN(10))
	}
	ds, err := data.NewDataset(&data.IDX{Dims: []int{n, 28, 28}, Data: img}, &data.IDX{Dims: []int{n}, Data: lab}, 10)
	if err != nil {
		panic(err) // the dimensions above are consistent
	}
	return ds
}
