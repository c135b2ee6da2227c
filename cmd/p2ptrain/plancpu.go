package main

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/p2ptrain/p2ptrain/compress/codecbench"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/p2ptrain/p2ptrain/pipeline"
)

// planCPU is what `p2ptrain plan` measured of the processor time a step
// costs besides the layers (pipeline.CPUCost), in the --json report, so
// that --layer-times takes it with the layers from the same measurement.
type planCPU struct {
	// Optimizer is the optimizer whose step UpdateS timed.
	Optimizer string  `json:"optimizer"`
	UpdateS   float64 `json:"update_s_per_param"`
	MessageS  float64 `json:"message_s"`
	ByteS     float64 `json:"byte_s"`
	// Codecs maps each codec spec measured to its seconds per value to
	// encode it and decode it once.
	Codecs map[string]float64 `json:"code_s_per_value"`
}

// Sizes of the processor measurements: the codecs code a buffer of
// codecValues (4 MiB of fp32, a ring segment's order of size), the
// optimizer steps updateReps times, the transport bounces wireRounds
// messages of each size.
const (
	codecValues = 1 << 20
	updateReps  = 5
	wireRounds  = 200
)

// measureCPU measures on this machine the processor figures have (the
// report of --layer-times; nil: none) lacks: the step of optimizer on m's
// parameters (m nil: have must hold that optimizer's), every codec of
// specs without a figure, and the transport. It keeps all of have's.
func measureCPU(ctx context.Context, m *model.Model, optimizer string, specs []string, have *planCPU) (planCPU, error) {
	out := planCPU{Optimizer: optimizer}
	if have != nil {
		out = *have
		out.Codecs = maps.Clone(have.Codecs)
	}
	if out.Codecs == nil {
		out.Codecs = map[string]float64{}
	}
	if have == nil || have.Optimizer != optimizer {
		switch {
		case m == nil && have == nil:
			return planCPU{}, fmt.Errorf("plan: the layer times carry no processor figures (made before they were measured): time the layers again, or give --cpu-costs=false")
		case m == nil:
			return planCPU{}, fmt.Errorf("plan: the layer times were measured with optimizer %q, not --optimizer %s: time the layers again", have.Optimizer, optimizer)
		}
		s, err := model.TimeOptimizerStep(model.OptimConfig{Name: optimizer}, m, updateReps)
		if err != nil {
			return planCPU{}, fmt.Errorf("plan: timing the optimizer: %w", err)
		}
		out.Optimizer, out.UpdateS = optimizer, s
	}
	var missing []string
	for _, s := range specs {
		if _, ok := out.Codecs[s]; !ok && !slices.Contains(missing, s) {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		code, err := codecbench.CodingSeconds(missing, codecValues)
		if err != nil {
			return planCPU{}, fmt.Errorf("plan: timing the codecs: %w", err)
		}
		maps.Copy(out.Codecs, code)
	}
	if have == nil {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		w, err := node.MeasureWireCost(wctx, nil, "", wireRounds)
		if err != nil {
			return planCPU{}, fmt.Errorf("plan: timing the transport: %w", err)
		}
		out.MessageS, out.ByteS = w.Message, w.Byte
	}
	return out, nil
}

// applyCPU returns setup's processor costs from c for a model on device
// dev, and codecs with their coding times.
func applyCPU(c planCPU, dev string, codecs []pipeline.CodecCost) (pipeline.CPUCost, []pipeline.CodecCost) {
	cost := pipeline.CPUCost{Update: c.UpdateS, Message: c.MessageS, Byte: c.ByteS, Beside: !strings.HasPrefix(dev, "cpu")}
	out := slices.Clone(codecs)
	for i := range out {
		out[i].Code = c.Codecs[out[i].Spec]
	}
	return cost, out
}

// checkCPU returns an error for figures of a --layer-times file out of range.
func checkCPU(c *planCPU, file string) error {
	if c == nil {
		return nil
	}
	vals := []float64{c.UpdateS, c.MessageS, c.ByteS}
	for _, v := range c.Codecs {
		vals = append(vals, v)
	}
	for _, v := range vals {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("plan: --layer-times %s: processor figures %+v are out of range", file, *c)
		}
	}
	return nil
}
