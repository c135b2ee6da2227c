package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/pipeline"
	"github.com/p2ptrain/p2ptrain/plan"
)

// gptPresets are the model sizes `p2ptrain plan --preset` knows.
var gptPresets = map[string]model.GPTConfig{
	"tiny":   {Layers: 2, DModel: 64, Heads: 2, Context: 64, Vocab: 256},
	"small":  {Layers: 4, DModel: 256, Heads: 4, Context: 128, Vocab: 256}, // the gpt's defaults
	"medium": {Layers: 8, DModel: 512, Heads: 8, Context: 128, Vocab: 256},
	"large":  {Layers: 12, DModel: 768, Heads: 12, Context: 256, Vocab: 256},
}

// planReport is what `p2ptrain plan --json` prints.
type planReport struct {
	Model      string  `json:"model"`
	Params     int     `json:"params"`
	Device     string  `json:"device"`
	TimedBatch int     `json:"timed_batch"`
	Peers      int     `json:"peers"`
	LinkBps    float64 `json:"link_bytes_per_s"`
	RTTS       float64 `json:"rtt_s"`
	Batch      int     `json:"batch"`
	Micro      int     `json:"micro_batches"`
	Schedule   string  `json:"schedule"`
	// SlowPeers compute Slowdown times slower than the timed device.
	SlowPeers int          `json:"slow_peers,omitempty"`
	Slowdown  float64      `json:"slowdown,omitempty"`
	Layers    []planLayer  `json:"layers"`
	CPU       *planCPU     `json:"cpu,omitempty"`
	Layouts   []planLayout `json:"layouts"`
	Fastest   string       `json:"fastest"`
}

type planLayer struct {
	Layer     string  `json:"layer"`
	ForwardS  float64 `json:"forward_s_per_sample"`
	BackwardS float64 `json:"backward_s_per_sample"`
	Params    int     `json:"params"`
	OutElems  int     `json:"out_values_per_sample"`
}

type planLayout struct {
	Layout    string `json:"layout"`
	Stages    int    `json:"stages"`
	Replicas  int    `json:"replicas"`
	Idle      int    `json:"idle,omitempty"`
	Batch     int    `json:"batch"`
	GradCodec string `json:"grad_codec,omitempty"`
	ActCodec  string `json:"act_codec,omitempty"`
	// ActLinks is each hop's activation and gradient codecs, "fwd/back",
	// under --act-link-codecs auto (ActCodec then lists the codecs a link
	// chooses among, joined by "|").
	ActLinks   []string `json:"act_links,omitempty"`
	Split      []int    `json:"split,omitempty"`
	PipelineS  float64  `json:"compute_s"`
	Bubble     float64  `json:"bubble"`
	HopS       float64  `json:"hop_s"`
	AllReduceS float64  `json:"allreduce_s"`
	TiedS      float64  `json:"tied_s"`
	UpdateS    float64  `json:"update_s"`
	CommCPUS   float64  `json:"comm_cpu_s"`
	StepS      float64  `json:"step_s"`
	PeerBytes  float64  `json:"peer_bytes"`
	PeerParams int      `json:"peer_params"`
}

// cmdPlan runs `p2ptrain plan`: it times the model's layers on a local
// device and projects the step time of pure data parallelism and of every
// hybrid layout of stages × replicas (docs/pipeline.md). Sizes the
// configuration refuses (the [train.gpt] ranges, node.max_peers …) and a
// model that would not fit in memory are usage errors; SIGINT or SIGTERM
// stops it at once.
func cmdPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", stdout)
	name := fs.String("model", "gpt", "`MODEL`: "+strings.Join(model.Names(), ", "))
	presets := slices.Sorted(func(yield func(string) bool) {
		for k := range gptPresets {
			if !yield(k) {
				return
			}
		}
	})
	preset := fs.String("preset", "small", "gpt size `NAME`: "+strings.Join(presets, ", ")+" (the --gpt-* flags override its fields)")
	var g model.GPTConfig
	fs.IntVar(&g.Layers, "gpt-layers", 0, "gpt transformer blocks (`N`)")
	fs.IntVar(&g.DModel, "gpt-d-model", 0, "gpt residual width (`N`)")
	fs.IntVar(&g.Heads, "gpt-heads", 0, "gpt attention heads (`N`)")
	fs.IntVar(&g.Context, "gpt-context", 0, "gpt tokens per sample (`N`)")
	fs.IntVar(&g.Vocab, "gpt-vocab", 0, "gpt vocabulary (`N`, at most 256)")
	peers := fs.Int("peers", 8, "peers in the cluster (`P`)")
	link := &rateValue{rate: 100e6 / 8}
	fs.Var(link, "link", "every link's `RATE` each way, e.g. 20mbit, 100mbit, 1gbit")
	rtt := fs.Duration("rtt", 2*time.Millisecond, "every link's round trip (`DURATION`)")
	batch := fs.Int("batch", 64, "global batch, samples per step (`N`)")
	micro := fs.Int("micro", 8, "micro-batches per pipeline and step (`M`)")
	grads := fs.String("grad-codecs", "none,dyn8", "gradient codec `SPECS` to compare (comma-separated)")
	acts := fs.String("act-codecs", "none,dyn8", "activation codec `SPECS` to compare (comma-separated)")
	actLinks := fs.String("act-link-codecs", "off", "`MODE` of the activation codecs per link (train.activation_link_codecs): off, auto (each link the most exact of none, bf16 and the codec whose transfer hides under the sending stage's compute), or both (each --act-codecs codec both ways)")
	idle := fs.Bool("idle", false, "also project S stages that do not divide --peers, the last peers idle (as train.pipeline_stages = auto does), with a global batch of --batch / peers per peer that trains, ranked by time per sample")
	slowPeers := fs.Int("slow-peers", 0, "of --peers, `N` compute --slowdown times slower than the timed device: each layout computes at its slowest member's pace, and a layout that leaves members idle (--idle) leaves the slow ones idle where they are more than 1.25× slower (as the ring planner does)")
	slowdown := fs.Float64("slowdown", 3, "how many times slower the --slow-peers compute (`F`, at least 1)")
	sched := fs.String("schedule", "1f1b", "pipeline `SCHEDULE`: 1f1b or gpipe")
	device := fs.String("device", "cpu", "device `SPEC` to time the layers on, e.g. cpu or cuda:0")
	timeBatch := fs.Int("time-batch", 0, "samples to time the layers on (`N`; default the per-peer batch, at most 4)")
	reps := fs.Int("reps", 3, "timed passes per layer (`N`; the median counts)")
	layerTimes := fs.String("layer-times", "", "take the per-layer times, and the processor figures, from `FILE` (the JSON of `p2ptrain plan --json` for the same model) instead of timing them")
	optimizer := fs.String("optimizer", "sgd", "the run's optimizer (`NAME`: "+strings.Join(model.OptimizerNames(), ", ")+"), whose step is timed")
	cpuCosts := fs.Bool("cpu-costs", true, "price the processor time of the optimizer's step and of the communication (codecs, the transport), measured here; false: the layers' compute and the wire only")
	top := fs.Int("top", 0, "print only the `N` fastest layouts (0: all)")
	showLayers := fs.Bool("layers", false, "print the measured per-layer times too")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	given := setFlags(fs)
	cfg := model.Config{}
	// The gpt's shape: the preset's, each --gpt-* flag given replacing its
	// field, within the ranges of [train.gpt]; --model as train.model.
	limits := []flagLimit{{"train.model", "--model", fromDefault(given["model"])}}
	if *name == "gpt" {
		base, ok := gptPresets[*preset]
		if !ok {
			return usagef("plan: unknown --preset %q (want %s)", *preset, strings.Join(presets, ", "))
		}
		for _, f := range []struct {
			dst, v    *int
			flag, key string
		}{{&base.Layers, &g.Layers, "gpt-layers", "layers"}, {&base.DModel, &g.DModel, "gpt-d-model", "d_model"}, {&base.Heads, &g.Heads, "gpt-heads", "heads"},
			{&base.Context, &g.Context, "gpt-context", "context"}, {&base.Vocab, &g.Vocab, "gpt-vocab", "vocab"}} {
			from := ""
			if given[f.flag] {
				*f.dst = *f.v
			} else {
				from = "--preset " + *preset
			}
			limits = append(limits, flagLimit{"train.gpt." + f.key, "--" + f.flag, from})
		}
		cfg.GPT = base
	}
	if err := flagLimits("plan", func(c *config.Config) {
		c.Train.Model = *name
		if *name == "gpt" {
			c.Train.GPT = config.GPT{Layers: cfg.GPT.Layers, DModel: cfg.GPT.DModel, Heads: cfg.GPT.Heads, Context: cfg.GPT.Context, Vocab: cfg.GPT.Vocab}
		}
	}, limits...); err != nil {
		return err
	}
	// --peers within node.max_peers' range, --time-batch within
	// train.batch_size's (it is a peer's batch).
	if *timeBatch < 0 {
		return usagef("plan: --time-batch must not be negative, got %d", *timeBatch)
	}
	if err := flagLimits("plan", func(c *config.Config) {
		c.Node.MaxPeers = *peers
		if *timeBatch != 0 {
			c.Train.BatchSize = *timeBatch
		}
	}, flagLimit{"node.max_peers", "--peers", fromDefault(given["peers"])}, flagLimit{"train.batch_size", "--time-batch", ""}); err != nil {
		return err
	}
	if _, err := gpu.ParseSpec(*device); err != nil {
		return usagef("plan: --device: %v", err)
	}
	for _, c := range []struct {
		flag string
		v    int
	}{{"--batch", *batch}, {"--micro", *micro}, {"--reps", *reps}} {
		if c.v < 1 {
			return usagef("plan: %s must be positive, got %d", c.flag, c.v)
		}
	}
	switch {
	case *top < 0:
		return usagef("plan: --top must not be negative, got %d", *top)
	case link.rate <= 0:
		return usagef("plan: --link must be a rate, not unlimited")
	case *rtt < 0:
		return usagef("plan: --rtt must not be negative")
	case *slowPeers < 0 || *slowPeers >= *peers:
		return usagef("plan: --slow-peers %d: want 0 up to --peers − 1 (%d)", *slowPeers, *peers-1)
	case !(*slowdown >= 1) || math.IsInf(*slowdown, 0):
		return usagef("plan: --slowdown %v: want a finite factor of at least 1", *slowdown)
	case *idle && *batch%*peers != 0:
		return usagef("plan: --idle takes a --batch that --peers divides (%d samples, %d peers): each peer that trains adds --batch / --peers", *batch, *peers)
	}
	sc, err := pipeline.ParseSchedule(*sched)
	if err != nil {
		return usagef("plan: --schedule: %v", err)
	}
	gradCosts, err := codecCosts(*grads)
	if err != nil {
		return usagef("plan: --grad-codecs: %v", err)
	}
	actCosts, err := codecCosts(*acts)
	if err != nil {
		return usagef("plan: --act-codecs: %v", err)
	}
	for _, a := range actCosts {
		if err := pipeline.ValidateCodec(a.Spec); err != nil {
			return usagef("plan: --act-codecs: %v", err)
		}
	}
	if *actLinks != "off" && *actLinks != "auto" && *actLinks != "both" {
		return usagef("plan: --act-link-codecs %q is not off, auto or both", *actLinks)
	}
	n := *timeBatch
	if n == 0 {
		n = min(max(*batch / *peers, 1), 4)
	}
	if !slices.Contains(model.OptimizerNames(), *optimizer) {
		return usagef("plan: --optimizer %q is not one of %s", *optimizer, strings.Join(model.OptimizerNames(), ", "))
	}
	var specs []string
	for _, c := range slices.Concat(gradCosts, actCosts) {
		specs = append(specs, c.Spec)
	}
	if *actLinks != "off" {
		for _, c := range actCosts {
			ladder, _ := pipeline.Ladder(c.Spec) // validated above
			for _, l := range ladder {
				if !slices.Contains(specs, l) {
					specs = append(specs, l)
				}
			}
		}
	}
	var measure *cpuRequest
	if *cpuCosts {
		measure = &cpuRequest{optimizer: *optimizer, specs: specs}
	}
	var infos []model.LayerInfo
	var costs []pipeline.LayerCost
	var devName string
	var cpu *planCPU
	if *layerTimes == "" {
		need, params, err := modelBytes(*name, cfg, n, cpuDevices([]string{*device}))
		if err != nil {
			return usagef("plan: %v", err)
		}
		what := "--model " + *name
		if *name == "gpt" {
			what = fmt.Sprintf("%s (%s parameters, context %d)", describeFlags(fs, "model", "preset", "gpt-layers", "gpt-d-model", "gpt-heads", "gpt-context", "gpt-vocab"),
				formatCount(params), cfg.GPT.Context)
		}
		what += fmt.Sprintf(" timed on %d samples (--time-batch) on --device %s", n, *device)
		if err := checkMemory("plan", what, need, modelMemory, "choose a smaller model or time fewer samples (--time-batch)"); err != nil {
			return err
		}
	}
	// Timing the layers and the processor may take long (--reps): SIGINT
	// and SIGTERM leave it behind.
	err = interruptible(ctx, func() (err error) {
		if *layerTimes != "" {
			infos, costs, devName, n, cpu, err = loadLayerTimes(*name, cfg, *layerTimes)
			if err == nil && measure != nil {
				var c planCPU
				c, err = measureCPU(ctx, nil, *optimizer, specs, cpu)
				cpu = &c
			}
			return err
		}
		var times []model.LayerTime
		if infos, times, devName, cpu, err = timeLayers(ctx, *name, cfg, *device, n, *reps, measure); err == nil {
			costs, err = pipeline.Costs(infos, times, n)
		}
		return err
	})
	if interrupted(ctx, stderr, "plan") {
		return nil
	}
	if err != nil {
		return err
	}
	setup := pipeline.Setup{Layers: costs, Peers: *peers, Batch: *batch, Micro: *micro, Bandwidth: link.rate, RTT: rtt.Seconds(), Schedule: sc, Idle: *idle}
	if *idle {
		setup.PerPeerBatch = *batch / *peers
	}
	if *slowPeers > 0 {
		compute := make([]float64, *peers)
		for i := range compute {
			compute[i] = 1
			if i >= *peers-*slowPeers {
				compute[i] = *slowdown
			}
		}
		setup.Slowdown = func(stages int) float64 { return plan.TrainingCompute(compute, stages) }
	}
	if measure == nil {
		cpu = nil
	} else {
		setup.CPU, gradCosts = applyCPU(*cpu, devName, gradCosts)
		_, actCosts = applyCPU(*cpu, devName, actCosts)
	}
	if actCosts, err = linkActCosts(actCosts, *actLinks, cpu); err != nil {
		return err
	}
	layouts, err := setup.Plan(gradCosts, actCosts)
	if err != nil {
		return err
	}
	rep := planReport{Model: describeModel(*name, *preset, cfg), Device: devName, TimedBatch: n, Peers: *peers, LinkBps: link.rate,
		RTTS: rtt.Seconds(), Batch: *batch, Micro: *micro, Schedule: sc.String(), CPU: cpu}
	if *slowPeers > 0 {
		rep.SlowPeers, rep.Slowdown = *slowPeers, *slowdown
	}
	for i, in := range infos {
		rep.Params += in.Params
		rep.Layers = append(rep.Layers, planLayer{Layer: in.Describe, ForwardS: costs[i].Forward, BackwardS: costs[i].Backward, Params: in.Params, OutElems: in.OutElems})
	}
	for _, l := range layouts {
		rep.Layouts = append(rep.Layouts, planLayout{Layout: l.Name(), Stages: l.Stages, Replicas: l.Replicas, Idle: l.Idle, Batch: l.Batch, GradCodec: l.Grad, ActCodec: l.Act, ActLinks: l.ActLinks,
			Split: l.Split, PipelineS: l.Compute, Bubble: l.Bubble, HopS: l.Hop, AllReduceS: l.AllReduce, TiedS: l.Tied, UpdateS: l.Update,
			CommCPUS: l.CommCPU, StepS: l.Step,
			PeerBytes: l.PeerBytes, PeerParams: l.PeerParams})
	}
	rep.Fastest = layouts[0].Name()
	if *top > 0 && len(rep.Layouts) > *top {
		rep.Layouts = rep.Layouts[:*top]
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printPlan(stdout, rep, *showLayers, layouts)
}

// codecCosts parses a comma-separated list of codec specs into their costs.
func codecCosts(list string) ([]pipeline.CodecCost, error) {
	specs, err := splitSpecs(list)
	if err != nil {
		return nil, err
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("no codec given")
	}
	var out []pipeline.CodecCost
	for _, s := range specs {
		c, err := pipeline.CodecCostOf(s)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// linkActCosts returns the activation codecs to project under
// --act-link-codecs mode: as they are (off), each with its ladder (auto),
// or each both ways (both). cpu holds the codecs' coding times (nil: not
// priced).
func linkActCosts(acts []pipeline.CodecCost, mode string, cpu *planCPU) ([]pipeline.CodecCost, error) {
	if mode == "off" {
		return acts, nil
	}
	var code map[string]float64
	if cpu != nil {
		code = cpu.Codecs
	}
	var out []pipeline.CodecCost
	for _, a := range acts {
		l, err := pipeline.WithLadder(a, code)
		if err != nil {
			return nil, err
		}
		if mode == "both" && len(l.Ladder) > 0 {
			out = append(out, a)
		}
		out = append(out, l)
	}
	return out, nil
}

// formatCount writes n with an SI prefix, e.g. "7.42M", "12.9G".
func formatCount(n int) string {
	v := float64(n)
	for _, p := range []string{"", "k", "M", "G"} {
		if v < 1000 || p == "G" {
			return fmt.Sprintf("%.3g%s", v, p)
		}
		v /= 1000
	}
	return ""
}

// describeFlags writes the flags of names that fs was given, with their
// values, e.g. "--preset small --gpt-heads 1".
func describeFlags(fs *flag.FlagSet, names ...string) string {
	given := setFlags(fs)
	var parts []string
	for _, n := range names {
		if f := fs.Lookup(n); f != nil && (given[n] || n == "preset") {
			parts = append(parts, "--"+n+" "+f.Value.String())
		}
	}
	return strings.Join(parts, " ")
}

// describeModel names the model and its shape.
func describeModel(name, preset string, cfg model.Config) string {
	if name != "gpt" {
		return name
	}
	c := cfg.GPT
	return fmt.Sprintf("gpt %s (%d blocks, d_model %d, %d heads, context %d, vocab %d)", preset, c.Layers, c.DModel, c.Heads, c.Context, c.Vocab)
}

// cpuRequest asks timeLayers to measure the processor figures too: the
// step of optimizer and the codecs of specs (measureCPU).
type cpuRequest struct {
	optimizer string
	specs     []string
}

// timeLayers builds model name on device spec for batches of n samples and
// times its layers on a random batch, and with cpu the processor figures
// (nil without).
func timeLayers(ctx context.Context, name string, cfg model.Config, spec string, n, reps int, cpu *cpuRequest) ([]model.LayerInfo, []model.LayerTime, string, *planCPU, error) {
	infos, err := model.Layers(name, cfg)
	if err != nil {
		return nil, nil, "", nil, err
	}
	devs, err := gpu.OpenAll([]string{spec})
	if err != nil {
		return nil, nil, "", nil, fmt.Errorf("plan: --device: %w", err)
	}
	defer gpu.CloseAll(devs)
	cfg.MaxBatch = n
	m, err := model.New(name, cfg, devs, 1)
	if err != nil {
		return nil, nil, "", nil, err
	}
	defer m.Close()
	times, err := m.ProfileLayers(m.RandomBatch(n, 1), reps)
	if err != nil {
		return nil, nil, "", nil, fmt.Errorf("plan: timing %s's layers on %s: %w", name, devs[0].Name(), err)
	}
	if cpu == nil {
		return infos, times, devs[0].Name(), nil, nil
	}
	c, err := measureCPU(ctx, m, cpu.optimizer, cpu.specs, nil)
	if err != nil {
		return nil, nil, "", nil, err
	}
	return infos, times, devs[0].Name(), &c, nil
}

// loadLayerTimes reads the per-sample layer times of a `p2ptrain plan
// --json` report in file for model name: its layers must be the model's
// (same count, parameters and output sizes). It returns the model's layers,
// their costs, the times' origin, the batch they were timed on and the
// report's processor figures (nil if it has none).
func loadLayerTimes(name string, cfg model.Config, file string) ([]model.LayerInfo, []pipeline.LayerCost, string, int, *planCPU, error) {
	infos, err := model.Layers(name, cfg)
	if err != nil {
		return nil, nil, "", 0, nil, err
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, "", 0, nil, fmt.Errorf("plan: --layer-times: %w", err)
	}
	var rep planReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, nil, "", 0, nil, fmt.Errorf("plan: --layer-times %s: %w", file, err)
	}
	if len(rep.Layers) != len(infos) {
		return nil, nil, "", 0, nil, fmt.Errorf("plan: --layer-times %s has %d layers, the model %d", file, len(rep.Layers), len(infos))
	}
	costs := make([]pipeline.LayerCost, len(infos))
	for i, in := range infos {
		l := rep.Layers[i]
		if l.Params != in.Params || l.OutElems != in.OutElems {
			return nil, nil, "", 0, nil, fmt.Errorf("plan: --layer-times %s: layer %d is %q (%d parameters, %d outputs), the model's %q (%d, %d)",
				file, i, l.Layer, l.Params, l.OutElems, in.Describe, in.Params, in.OutElems)
		}
		if !(l.ForwardS >= 0 && l.BackwardS >= 0) || math.IsInf(l.ForwardS+l.BackwardS, 0) {
			return nil, nil, "", 0, nil, fmt.Errorf("plan: --layer-times %s: layer %d's times %g s and %g s are out of range", file, i, l.ForwardS, l.BackwardS)
		}
		costs[i] = pipeline.LayerCost{Forward: l.ForwardS, Backward: l.BackwardS, Params: in.Params, Tied: in.Tied, TiedParams: in.TiedParams, OutElems: in.OutElems}
	}
	if err := checkCPU(rep.CPU, file); err != nil {
		return nil, nil, "", 0, nil, err
	}
	return infos, costs, fmt.Sprintf("%s (from %s)", rep.Device, file), rep.TimedBatch, rep.CPU, nil
}

// printPlan writes the report as tables.
func printPlan(w io.Writer, rep planReport, showLayers bool, all []pipeline.Layout) error {
	var fb float64
	for _, l := range rep.Layers {
		fb += l.ForwardS + l.BackwardS
	}
	fmt.Fprintf(w, "%s: %.2fM parameters, %d layers\n", rep.Model, float64(rep.Params)/1e6, len(rep.Layers))
	fmt.Fprintf(w, "timed on %s at %d samples: %.2f ms forward+backward per sample\n", rep.Device, rep.TimedBatch, fb*1e3)
	if c := rep.CPU; c != nil {
		codecs := slices.Sorted(func(yield func(string) bool) {
			for k, v := range c.Codecs {
				if !yield(fmt.Sprintf("%s %.2f ns", shortSpec(k), v*1e9)) {
					return
				}
			}
		})
		fmt.Fprintf(w, "processor: %s step %.2f ns per parameter; transport %.1f µs per message + %.2f ns per byte; coding per value: %s\n",
			c.Optimizer, c.UpdateS*1e9, c.MessageS*1e6, c.ByteS*1e9, strings.Join(codecs, ", "))
	} else {
		fmt.Fprintln(w, "processor: not priced (--cpu-costs=false): the layers' compute and the wire only")
	}
	slow := ""
	if rep.SlowPeers > 0 {
		slow = fmt.Sprintf(" (%d of them %.3g× slower)", rep.SlowPeers, rep.Slowdown)
	}
	fmt.Fprintf(w, "%d peers%s, links %s RTT %v, batch %d, %d micro-batches per pipeline, %s\n\n",
		rep.Peers, slow, formatRate(rep.LinkBps), time.Duration(rep.RTTS*float64(time.Second)), rep.Batch, rep.Micro, rep.Schedule)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if showLayers {
		fmt.Fprintln(tw, "#\tLAYER\tFWD/SAMPLE\tBWD/SAMPLE\tPARAMS\tOUT/SAMPLE")
		for i, l := range rep.Layers {
			fmt.Fprintf(tw, "%d\t%s\t%.3f ms\t%.3f ms\t%d\t%d\n", i, l.Layer, l.ForwardS*1e3, l.BackwardS*1e3, l.Params, l.OutElems)
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	fmt.Fprintln(tw, "LAYOUT\tGRAD\tACT\tSPLIT\tCOMPUTE\tBUBBLE\tHOP\tALLREDUCE\tTIED\tUPDATE\tCOMM CPU\tSTEP\tSENT/PEER\tPARAMS/PEER")
	for _, l := range rep.Layouts {
		split := "-"
		if len(l.Split) > 0 {
			var parts []string
			for s := 0; s+1 < len(l.Split); s++ {
				parts = append(parts, fmt.Sprintf("%d:%d", l.Split[s], l.Split[s+1]))
			}
			split = strings.Join(parts, " ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f MB\t%.2fM\n", l.Layout, shortSpec(dash(l.GradCodec)), actColumn(dash(l.ActCodec), l.ActLinks), split,
			secs(l.PipelineS), 100*l.Bubble, secs(l.HopS), secs(l.AllReduceS), secs(l.TiedS), secs(l.UpdateS), secs(l.CommCPUS), secs(l.StepS), l.PeerBytes/1e6, float64(l.PeerParams)/1e6)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	best := all[0]
	line := fmt.Sprintf("\nfastest: %s with %s gradients", best.Name(), shortSpec(dash(best.Grad)))
	if best.Stages > 1 {
		line += fmt.Sprintf(" and %s activations", actColumn(best.Act, best.ActLinks))
	}
	line += fmt.Sprintf(", %s per step", secs(best.Step))
	if best.Idle > 0 {
		line += fmt.Sprintf(" of %d samples, %d peers idle", best.Batch, best.Idle)
	}
	for _, l := range all {
		if l.Stages == 1 && best.Stages > 1 {
			// ×: time per sample, the step's when the batches are equal
			// (idle members make a layout's smaller).
			line += fmt.Sprintf(" (pure data parallelism at best, with %s gradients: %s, ×%.2f)", shortSpec(dash(l.Grad)), secs(l.Step),
				l.Step/float64(l.Batch)/(best.Step/float64(best.Batch)))
			break
		}
	}
	if best.Stages > 1 {
		// The cut balanced by the times measured here, as settings every
		// peer gives (a fixed train.pipeline_stages cuts by parameter
		// counts otherwise).
		var cut []string
		for _, v := range best.Split {
			cut = append(cut, strconv.Itoa(v))
		}
		act := best.Act
		if best.ActLinks != nil {
			act = act[strings.LastIndex(act, "|")+1:] + " --set train.activation_link_codecs=auto"
		}
		line += fmt.Sprintf("\nto train it: --set train.pipeline_stages=%d --set train.pipeline_split=%s --set train.batch_size=%d --set train.micro_batches=%d --set train.activation_codec=%s",
			best.Stages, strings.Join(cut, ","), best.Batch/best.Replicas, best.Micro, act)
		if best.Grad != "" {
			line += " --codec " + best.Grad
		}
	}
	_, err := fmt.Fprintln(w, line)
	return err
}

// actColumn names a layout's activation codec for the table: the codec,
// or with per-link codecs (links, "fwd/back" per hop) "auto:" the codec
// the links fall back to and what each hop carries, e.g.
// "auto:dyn8 [none/none]".
func actColumn(act string, links []string) string {
	if links == nil {
		return shortSpec(act)
	}
	hops := make([]string, len(links))
	for i, l := range links {
		fwd, back, _ := strings.Cut(l, "/")
		hops[i] = shortSpec(fwd) + "/" + shortSpec(back)
	}
	return "auto:" + shortSpec(act[strings.LastIndex(act, "|")+1:]) + " [" + strings.Join(hops, " ") + "]"
}

// shortSpec drops a codec spec's default parameters for the table.
func shortSpec(spec string) string {
	name, _, _ := strings.Cut(spec, ":")
	if def, err := pipeline.CodecCostOf(name); err == nil && def.Spec == spec {
		return name
	}
	return spec
}

// secs formats seconds as ms below one second, 0 as "-".
func secs(s float64) string {
	if s == 0 {
		return "-"
	}
	if s < 1 {
		return fmt.Sprintf("%.1f ms", s*1e3)
	}
	return fmt.Sprintf("%.2f s", s)
}
