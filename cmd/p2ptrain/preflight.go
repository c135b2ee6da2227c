package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/data"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/gpu/cuda"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/p2ptrain/p2ptrain/train"
)

// preflight checks what config.Validate cannot see in the values alone:
// that the files and devices the configuration names can be read and
// opened, so a peer with a bad configuration exits 2 before it starts and
// announces itself. It reads the swarm key and the identity (as node.New
// will), and for a peer that trains with the built-in trainer finds its
// dataset (IDX headers, plain files' sizes and the images' shape against
// the model's input, or the corpus's size; a small corpus is loaded)
// and its devices (CUDA's driver and libraries, and the GPU indices); for
// any trainer, train.checkpoint_dir (created if missing, writable, its
// latest checkpoint not past train.steps).
// Every problem is reported, each naming its key; values Validate rejects
// are left to it.
func preflight(cfg config.Config) error {
	var errs []error
	if p := cfg.Node.SwarmKey; p != "" {
		if _, err := node.LoadSwarmKey(p); err != nil {
			errs = append(errs, keyError("node.swarm_key", err))
		}
	}
	if p := cfg.Node.Identity; p != "" {
		if _, err := node.LoadIdentity(p); err != nil {
			errs = append(errs, keyError("node.identity", err))
		}
	}
	if cfg.Train.Steps > 0 && cfg.Train.Trainer == config.TrainerBuiltin {
		errs = append(errs, checkDataset(cfg.Train), checkDevices(cfg.Train.Devices), checkModelMemory(cfg.Train))
	}
	if cfg.Train.Steps > 0 {
		errs = append(errs, train.CheckCheckpointDir(cfg.Train))
	}
	return errors.Join(errs...)
}

// checkModelMemory refuses a data-parallel model (one pipeline stage)
// that would not fit in this machine's memory (modelBytes, with the whole
// train.batch_size on this peer's devices, as when it trains alone): the
// peer ran out of memory after it had announced itself.
func checkModelMemory(t config.Train) error {
	if s := t.PipelineStages; s.Auto() || int(s) > 1 || !slices.Contains(model.Names(), t.Model) {
		return nil
	}
	devs := max(1, len(t.Devices))
	g := t.GPT
	mcfg := model.Config{Hidden: t.Hidden, GPT: model.GPTConfig{Layers: g.Layers, DModel: g.DModel, Heads: g.Heads, Context: g.Context, Vocab: g.Vocab}}
	need, _, err := modelBytes(t.Model, mcfg, (t.BatchSize+devs-1)/devs, cpuDevices(t.Devices))
	if err != nil {
		return nil // Validate reports the model's own errors
	}
	what := fmt.Sprintf("train.model = %q with train.batch_size = %d", t.Model, t.BatchSize)
	if t.Model == "gpt" {
		what += fmt.Sprintf(" and [train.gpt] layers %d, d_model %d, heads %d, context %d", g.Layers, g.DModel, g.Heads, g.Context)
	}
	return checkMemory("train.batch_size", what, need, modelMemory, "lower train.batch_size (or the model's size), or split the model with train.pipeline_stages")
}

// keyError names key in err, dropping the package prefix ("node: ") its
// message starts with.
func keyError(key string, err error) error {
	msg := err.Error()
	if pkg, rest, ok := strings.Cut(msg, ": "); ok && !strings.ContainsAny(pkg, " /") {
		msg = rest
	}
	return fmt.Errorf("%s: %s", key, msg)
}

// checkDataset finds train.model's data: the gpt's text corpus
// (train.data), or Fashion-MNIST (train.data_dir) for the others.
func checkDataset(t config.Train) error {
	switch {
	case t.Model == "gpt":
		opts := data.TextOptions{Extensions: t.DataExt, HeldOut: data.DefaultHeldOut, MaxBytes: t.DataMaxBytes, Context: t.GPT.Context}
		var err error
		if t.Data == "" {
			err = data.CheckGoSource(opts)
		} else if _, serr := os.Stat(t.Data); serr == nil { // Validate reports a path it cannot stat
			err = data.CheckText(t.Data, opts)
		}
		if err != nil {
			return keyError("train.data", err)
		}
	case slices.Contains(model.Names(), t.Model):
		if err := data.CheckFashionMNISTFor(t.DataDir, t.Model); err != nil {
			if t.DataDir == "" && errors.Is(err, data.ErrNoDataset) {
				err = fmt.Errorf("%w, or set train.data_dir", err)
			}
			return keyError("train.data_dir", err)
		}
	}
	return nil
}

// checkDevices reports the train.devices that cannot be opened, without
// opening them: a CPU index out of range, a device listed twice, or a CUDA
// device when no GPU is usable (no driver, no device, no cuBLAS or NVRTC)
// or the driver has no such index. Specs Validate rejects are skipped.
func checkDevices(specs []string) error {
	var errs []error
	var gpus []cuda.DeviceInfo
	var gpuErr error
	probed := false
	seen := map[string]bool{}
	for i, spec := range specs {
		s, err := gpu.ParseSpec(spec)
		if err != nil {
			continue
		}
		key := fmt.Sprintf("train.devices[%d]", i)
		var names []string
		switch s.Kind {
		case "cpu":
			if s.Index >= gpu.MaxCPUDevices {
				errs = append(errs, fmt.Errorf("%s: %q: cpu index %d out of range [0, %d)", key, spec, s.Index, gpu.MaxCPUDevices))
				continue
			}
			names = []string{gpu.NewCPU(s.Index).Name()}
		case "cuda":
			if !probed {
				gpus, gpuErr = usableGPUs()
				probed = true
			}
			switch {
			case gpuErr != nil:
				errs = append(errs, fmt.Errorf("%s: %q: no usable GPU: %v\n  `p2ptrain devices` shows what this machine has; use \"cpu\" to train on the processor", key, spec, gpuErr))
				continue
			case !s.All && s.Index >= len(gpus):
				errs = append(errs, fmt.Errorf("%s: %q: no such GPU: the CUDA driver sees %d (cuda:0 to cuda:%d)", key, spec, len(gpus), len(gpus)-1))
				continue
			}
			for _, g := range gpus {
				if s.All || g.Index == s.Index {
					names = append(names, g.Spec())
				}
			}
		}
		for _, n := range names {
			if seen[n] {
				errs = append(errs, fmt.Errorf("%s: %q: device %s listed twice", key, spec, n))
			}
			seen[n] = true
		}
	}
	return errors.Join(errs...)
}

// usableGPUs returns the CUDA devices training can use: the driver's, when
// cuBLAS and NVRTC load as well (what `p2ptrain devices` checks).
func usableGPUs() ([]cuda.DeviceInfo, error) {
	drv, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	devs, err := drv.Devices()
	if err != nil {
		return nil, err
	}
	if _, err := cuda.LoadBLAS(drv.Version()); err != nil {
		return nil, err
	}
	if _, err := cuda.LoadNVRTC(drv.Version()); err != nil {
		return nil, err
	}
	return devs, nil
}
