package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
)

// This file holds what `bench` and `plan` share to refuse sizes they cannot
// run and to stop when interrupted:
//
//   - flagLimits checks flag values against the limits the configuration
//     sets for the same quantities (config.Validate: train.batch_size at
//     most 4096, the [train.gpt] ranges, node.max_peers at most 1024 …),
//     so the commands refuse what `join` refuses, with the same bounds;
//   - the memory estimates refuse, before anything is allocated, a run
//     that would not fit in this machine's memory (exit 2, naming the
//     flags, the estimate and the memory);
//   - interruptible and interrupted let SIGINT and SIGTERM end a command
//     promptly, with one line, and exit 130 or 143 (main), as `join` does.

// flagLimit maps a configuration key to the flag that sets the same
// quantity.
type flagLimit struct {
	key, flag string
	// from names where the value came from when the flag was not given,
	// e.g. "--preset small" ("": the command line).
	from string
}

// fromDefault is flagLimit.from for a flag given or not.
func fromDefault(given bool) string {
	if given {
		return ""
	}
	return "the default"
}

// flagLimits validates, with config.Validate, a default configuration that
// set has given the flags' values, and returns a usage error naming the
// flag of every key of limits that it reports, e.g. "bench train:
// --batch-size: 99999 is above 4096 (as config key train.batch_size)". Problems
// of other keys are not the flags' and are ignored.
func flagLimits(cmd string, set func(*config.Config), limits ...flagLimit) error {
	cfg := config.DefaultConfig()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"} // not under test; keeps the report to the keys set
	set(&cfg)
	err := cfg.Validate()
	if err == nil {
		return nil
	}
	var msgs []string
	for _, e := range leaves(err) {
		base := keyOf(e)
		key, msg, _ := strings.Cut(e.Error(), ": ")
		for _, l := range limits {
			if l.key != base {
				continue
			}
			for _, o := range limits {
				msg = strings.ReplaceAll(msg, o.key, o.flag) // "a multiple of train.gpt.heads" → "of --gpt-heads"
			}
			note := "as config key " + key
			if l.from != "" {
				note += "; the value is " + l.from + "'s"
			}
			msgs = append(msgs, fmt.Sprintf("%s: %s: %s (%s)", cmd, l.flag, msg, note))
			break
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return usagef("%s", strings.Join(msgs, "\n"))
}

// Memory estimates. The figures were fitted to the peak resident memory
// (/usr/bin/time -f %M) of the commands on a 2-core amd64 machine and err
// on the high side: besides baseBytes, up to 1.5 times the measurement for
// the models, twice for the all-reduce with linear codecs.
const (
	// baseBytes is the process besides what the estimates count: the
	// runtime and the code (about 100 MB), a dataset (Fashion-MNIST as
	// fp32: bench train --model mlp --batch-size 2 peaked at 373 MB) or
	// corpus, the codec timings.
	baseBytes = 384 << 20
	// optimizerCopies is the parameter-sized host vectors besides the
	// parameters and their gradients: the optimizer's state (Adam keeps
	// two moments; SGD with momentum one).
	optimizerCopies = 2
	// allreducePeerCopies is the buffer-sized memory of one simulated
	// peer of `bench allreduce --inproc`: its data and result, the codec's
	// state and the frames in flight (measured 3.6 for dyn8, 4.7 to 7 for
	// none), and for low-rank codecs (powersgd: 11) allreduceLowRankCopies.
	allreducePeerCopies    = 8
	allreduceLowRankCopies = 12
	// allreducePairBytes is what every pair of simulated peers holds
	// (streams and their buffers): 512 peers held 2.9 GB with 4 KiB buffers.
	allreducePairBytes = 12 << 10
	// codecBenchCopies is the input-sized memory of `bench codecs`: the
	// input, the decoded output, the wire buffer and a codec's state, one
	// codec after the other (a 64 MiB input peaked at 550 MB).
	codecBenchCopies = 10
)

// modelBytes estimates the host memory of model name (cfg) trained on
// batches of batch samples per device, cpuDevs of its devices being the
// processor's: the parameters, their gradients and the optimizer's state
// on the host, and on every CPU device a replica's parameters, gradients
// and activations (a GPU holds its own in its memory). It also returns the
// parameter count.
func modelBytes(name string, cfg model.Config, batch, cpuDevs int) (float64, int, error) {
	infos, err := model.Layers(name, cfg)
	if err != nil {
		return 0, 0, err
	}
	params, outs := 0, 0
	for _, in := range infos {
		params += in.Params
		outs += in.OutElems
	}
	var perSample float64
	if name == "gpt" {
		g, err := cfg.GPT.Resolved()
		if err != nil {
			return 0, 0, err
		}
		l, t, d, h, v := float64(g.Layers), float64(g.Context), float64(g.DModel), float64(g.Heads), float64(g.Vocab)
		// Per block: the LayerNorms' outputs, input gradients and
		// statistics (2·(2TD + 2T)), the attention's projections, their
		// input gradients and head outputs (10TD) and its probabilities
		// and their gradients (2HT²), the MLP's (18TD). Then the
		// embedding, the final LayerNorm, the head and the loss.
		perSample = l*(32*t*d+2*h*t*t+4*t) + 4*t*d + 4*t*v + 8*t
	} else {
		// Every layer's output and input gradient, and a convolution's
		// im2col matrix: 2.5 (mlp) to 2.8 (cnn) times the outputs.
		perSample = 3 * float64(outs)
	}
	p := float64(params)
	return 4 * (p*(2+optimizerCopies) + float64(cpuDevs)*(2*p+float64(batch)*perSample)), params, nil
}

// modelMemory is what modelBytes counts, for checkMemory.
const modelMemory = "the model's parameters, gradients, optimizer state and activations"

// cpuDevices counts the processor devices of specs (each spec a device:
// "cpu" is cpu:0).
func cpuDevices(specs []string) int {
	n := 0
	for _, s := range specs {
		if sp, err := gpu.ParseSpec(s); err == nil && sp.Kind == "cpu" {
			n++
		}
	}
	return n
}

// machineMemory returns the memory this process can use now, in bytes
// (MemAvailable, within the cgroup's limit), and the machine's in all
// (MemTotal); ok is false where it cannot tell (not Linux). Tests replace
// it.
var machineMemory = func() (avail, total float64, ok bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "MemTotal:":
			total = v * 1024
		case "MemAvailable:":
			avail = v * 1024
		}
	}
	if total == 0 || avail == 0 {
		return 0, 0, false
	}
	// cgroup v2: a limit below the machine's. Its memory.current counts
	// the page cache too, which the kernel reclaims before it refuses
	// memory: the inactive file pages (memory.stat) are taken off.
	if b, err := os.ReadFile(filepath.Join(cgroupDir, "memory.max")); err == nil {
		if lim, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64); err == nil && lim < total {
			used := 0.0
			if c, err := os.ReadFile(filepath.Join(cgroupDir, "memory.current")); err == nil {
				used, _ = strconv.ParseFloat(strings.TrimSpace(string(c)), 64)
			}
			used = max(used-cgroupStat("inactive_file"), 0)
			total, avail = lim, min(avail, max(lim-used, 0))
		}
	}
	return avail, total, true
}

// cgroupDir is this process's cgroup v2 directory (tests replace it).
var cgroupDir = "/sys/fs/cgroup"

// cgroupStat returns the value of key in this cgroup's memory.stat (0 when
// absent or unreadable).
func cgroupStat(key string) float64 {
	b, err := os.ReadFile(filepath.Join(cgroupDir, "memory.stat"))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == key {
			x, _ := strconv.ParseFloat(v, 64)
			return x
		}
	}
	return 0
}

// checkMemory returns a usage error when need bytes, the estimate for
// the flags what names, of the memory the things of for take, exceed the
// memory available, e.g. "bench train: --model gpt --batch-size 4096
// --devices cpu would need about 76.4 GiB of memory for the model's
// parameters, gradients, optimizer state and activations; this machine has
// 21.2 GiB available (23.5 GiB in all): lower --batch-size".
func checkMemory(cmd, what string, need float64, of, hint string) error {
	need += baseBytes
	avail, total, ok := machineMemory()
	if !ok || need <= avail {
		return nil
	}
	return usagef("%s: %s would need about %s of memory for %s; this machine has %s available (%s in all): %s",
		cmd, what, formatBytes(need), of, formatBytes(avail), formatBytes(total), hint)
}

// formatBytes writes n bytes in binary units, e.g. "1.5 GiB".
func formatBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// errInterrupted is what interruptible returns when ctx ended first.
var errInterrupted = errors.New("interrupted")

// interruptible runs f and returns its error, or errInterrupted as soon as
// ctx is done (SIGINT, SIGTERM): work that does not watch ctx itself (the
// codecs' timing, the model's layer profile, an in-process benchmark's
// setup) is left running, to end with the process, which exits once the
// command returns. f must not write where the caller reads after an
// interruption.
func interruptible(ctx context.Context, f func() error) error {
	if ctx.Err() != nil {
		return errInterrupted
	}
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return errInterrupted
	}
}

// interrupted reports whether ctx was canceled (SIGINT or SIGTERM: main
// cancels it), and then writes the one line that says cmd stopped: the
// command returns nil, and main exits 130 or 143 as for `join`, whatever
// error the interruption caused (a canceled step, an aborted all-reduce).
func interrupted(ctx context.Context, stderr io.Writer, cmd string) bool {
	if ctx.Err() == nil {
		return false
	}
	fmt.Fprintf(stderr, "p2ptrain: %s: interrupted\n", cmd)
	return true
}
