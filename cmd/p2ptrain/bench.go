package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/compress/codecbench"
)

// cmdBench dispatches `p2ptrain bench <what>`.
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("bench: name what to measure: codecs or allreduce (gradient exchange), or train (local steps)")
	}
	switch args[0] {
	case "codecs":
		return cmdBenchCodecs(ctx, args[1:], stdout, stderr)
	case "allreduce":
		return cmdBenchAllreduce(ctx, args[1:], stdout, stderr)
	case "train":
		return cmdBenchTrain(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, "Usage:\n  p2ptrain bench codecs [flags]      measure every gradient codec (codecs -h lists flags)\n"+
			"  p2ptrain bench allreduce [flags]   measure the all-reduce (allreduce -h lists flags)\n"+
			"  p2ptrain bench train [flags]       measure local training steps per device set (train -h lists flags)\n")
		return errHelp
	default:
		return usagef("bench: unknown benchmark %q (want codecs, allreduce or train)", args[0])
	}
}

// cmdBenchCodecs runs `p2ptrain bench codecs`: every codec (or the --codecs
// list) on a seeded gradient-like input, as a table or a JSON list.
// SIGINT or SIGTERM stops it at once.
func cmdBenchCodecs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench codecs", stdout)
	size := &sizeFlag{n: codecbench.DefaultSize}
	fs.Var(size, "size", "number of float32 `VALUES` to encode (e.g. 4096, 1Mi)")
	asJSON := fs.Bool("json", false, "print a JSON list of {codec, ratio, encode_gbps, decode_gbps, rel_error}")
	codecs := fs.String("codecs", "", "comma-separated codec `SPECS` to measure (default: every codec); "+
		"a spec's own parameters stay with it, e.g. qsgd:bits=4,block=512,int8")
	repeats := fs.Int("repeats", 5, "timed encodes and decodes per codec (the median counts)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if size.n <= 0 {
		return usagef("bench codecs: --size must be positive, got %d", size.n)
	}
	if *repeats <= 0 {
		return usagef("bench codecs: --repeats must be positive, got %d", *repeats)
	}
	specs, err := splitSpecs(*codecs)
	if err != nil {
		return usagef("bench codecs: --codecs: %v", err)
	}
	if err := checkMemory("bench codecs", fmt.Sprintf("--size %s", formatQuantity(size.n, false)),
		codecBenchCopies*4*float64(size.n), "the input, its decoding and the codecs' state", "lower --size"); err != nil {
		return err
	}
	var rs []codecbench.Result
	err = interruptible(ctx, func() (err error) {
		rs, err = codecbench.Run(codecbench.Config{Size: size.n, Repeats: *repeats, Codecs: specs})
		return err
	})
	if interrupted(ctx, stderr, "bench codecs") {
		return nil
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return codecbench.WriteJSON(stdout, rs)
	}
	return codecbench.WriteTable(stdout, rs)
}

// splitSpecs splits a comma-separated list of codec specs. Specs have
// comma-separated parameters themselves ("qsgd:bits=4,block=512"), so a
// piece of the form key=value with no colon continues the previous spec.
// Every spec is validated.
func splitSpecs(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var specs []string
	for part := range strings.SplitSeq(list, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, fmt.Errorf("empty codec spec in %q", list)
		}
		if len(specs) > 0 && strings.Contains(part, "=") && !strings.Contains(part, ":") {
			specs[len(specs)-1] += "," + part
			continue
		}
		specs = append(specs, part)
	}
	for _, s := range specs {
		if err := compress.Validate(s); err != nil {
			return nil, err
		}
	}
	return specs, nil
}
