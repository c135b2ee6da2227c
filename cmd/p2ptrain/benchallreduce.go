package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/allreducebench"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/config"
)

// benchAllreduceFlags are the flags of `p2ptrain bench allreduce`: the
// measurement, the in-process network (--inproc), and, for a cluster member,
// every flag of `join` plus --expect and --timeout.
type benchAllreduceFlags struct {
	fs   *flag.FlagSet
	peer *peerFlags // --codec is one of them; it serves both modes

	size     sizeFlag
	schedule string
	rounds   int
	json     bool
	chunk    sizeFlag
	buckets  int

	inproc    bool
	peers     int
	bandwidth rateFlag
	latency   time.Duration
	links     string

	expect   int
	timeout  time.Duration
	linkRate rateValue

	cpuProfile string
}

// inprocOnly and clusterOnly name the flags of one mode.
var (
	inprocOnly  = []string{"peers", "bandwidth", "latency"}
	clusterOnly = []string{"expect", "timeout", "link-rate"}
)

func addBenchAllreduceFlags(fs *flag.FlagSet) *benchAllreduceFlags {
	f := &benchAllreduceFlags{fs: fs, size: sizeFlag{n: 64 << 20, bytes: true}, chunk: sizeFlag{bytes: true}}
	f.peer = addPeerFlags(fs)
	fs.Var(&f.size, "size", "fp32 buffer `BYTES` all-reduced each round (e.g. 4MiB, 64MiB, 1GiB)")
	fs.StringVar(&f.schedule, "schedule", "", "`SCHEDULE`: ring, direct, allgather, proportional (bandwidth shares), hier (two levels, groups of about √W; "+
		"in-process also hier-SIZExCOUNT…, e.g. hier-4x4) or auto "+
		"(picks ring or proportional and the order from the link rates, like a training cluster; with --link-codecs "+
		"the ring with per-link codecs where predicted faster); default: the codec's own "+
		"(a cluster member: [allreduce] schedule of --config, where auto means the codec's own)")
	fs.IntVar(&f.rounds, "rounds", 5, "timed `ROUNDS` after one warm-up round (the median counts)")
	fs.BoolVar(&f.json, "json", false, "print one JSON object {size_bytes, codec, schedule, peers, median_s, algbw_gbps, busbw_gbps, wire_bytes_per_peer, ideal_s, efficiency, cpu_s_per_gb, and in a cluster machine_cpu_s_per_gb}")
	fs.Var(&f.chunk, "chunk-bytes", "pipeline chunk `BYTES` of fp32 per frame, as allreduce.chunk_bytes (default 256KiB; a cluster member: allreduce.chunk_bytes of its configuration)")
	fs.IntVar(&f.buckets, "buckets", 1, "split the buffer into `N` fusion buckets, handed over in backward order")
	fs.BoolVar(&f.inproc, "inproc", false, "run every peer in this process over simulated links (--peers, --bandwidth, --latency)")
	fs.IntVar(&f.peers, "peers", 4, "with --inproc: number of simulated `PEERS`")
	fs.Var(&f.bandwidth, "bandwidth", "with --inproc: each peer's link `RATE`, both directions: one for all or a comma list "+
		"per peer (e.g. 1gbit or 100mbit,1gbit,1gbit,1gbit; default unlimited)")
	fs.DurationVar(&f.latency, "latency", 0, "with --inproc: one-way `DELAY` added to every frame (e.g. 1ms)")
	fs.StringVar(&f.links, "link-codecs", "off", "per-link codecs of the ring schedule from the link rates (--bandwidth with --inproc, "+
		"else the probes' figures): `MODE` off, auto (stronger compression of the codec's family on slow links) or a codec spec used on slow links")
	fs.IntVar(&f.expect, "expect", 0, "cluster member: wait until the ring has `N` peers, then measure with them (required without --inproc)")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Minute, "cluster member: how long to wait for --expect peers")
	fs.Var(&f.linkRate, "link-rate", "cluster member: this host's link `RATE` (e.g. 95.6mbit, the goodput TCP reaches on a 100 Mbit/s link), "+
		"for the link-limited ideal time and the efficiency (ideal / median); with --inproc they come from --bandwidth")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a Go CPU profile of the whole run to `FILE` (read it with `go tool pprof`)")
	return f
}

// cmdBenchAllreduce runs `p2ptrain bench allreduce`, in-process or as a
// member of a real cluster.
func cmdBenchAllreduce(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench allreduce", stdout)
	f := addBenchAllreduceFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return err
	}
	if err := f.checkMemory(); err != nil {
		return err
	}
	stop, err := startCPUProfile(f.cpuProfile)
	if err != nil {
		return err
	}
	if f.inproc {
		err = f.runInproc(ctx, stdout)
	} else {
		err = f.runCluster(ctx, stdout, stderr)
	}
	if interrupted(ctx, stderr, "bench allreduce") {
		err = nil // SIGINT, SIGTERM: the peers were stopped (a cluster member left); main exits 130 or 143
	}
	return errors.Join(err, stop())
}

// checkMemory refuses a run whose buffers would not fit in this machine's
// memory: every simulated peer's (--inproc), or this member's.
func (f *benchAllreduceFlags) checkMemory() error {
	spec, err := f.codecSpec()
	if err != nil {
		return usagef("bench allreduce: --codec: %v", err)
	}
	copies := float64(allreducePeerCopies)
	if c, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(0)}); err == nil && c.Class() == compress.ClassLowRank {
		copies = allreduceLowRankCopies
	}
	peers, what := 1, fmt.Sprintf("--size %s", formatQuantity(f.size.n, true))
	if f.inproc {
		peers, what = f.peers, fmt.Sprintf("--inproc --peers %d --size %s", f.peers, formatQuantity(f.size.n, true))
	}
	need := float64(peers)*copies*float64(f.size.n) + float64(peers)*float64(peers-1)/2*allreducePairBytes
	hint := "lower --size"
	if f.inproc {
		hint = "lower --size or --peers"
	}
	return checkMemory("bench allreduce", what, need, "the peers' buffers, the codecs' state and the frames in flight", hint)
}

// startCPUProfile starts Go's CPU profiler writing to path ("" profiles
// nothing); the returned function stops it and closes the file.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, usagef("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile %s: %w", path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("--cpuprofile %s: %w", path, err)
		}
		return nil
	}, nil
}

// validate checks the flags of both modes; every error names its flag.
func (f *benchAllreduceFlags) validate() error {
	const cmd = "bench allreduce"
	set := setFlags(f.fs)
	switch {
	case f.size.n <= 0 || f.size.n%4 != 0:
		return usagef("%s: --size must be a positive multiple of 4 bytes (fp32), got %d", cmd, f.size.n)
	case f.rounds <= 0:
		return usagef("%s: --rounds must be positive, got %d", cmd, f.rounds)
	case f.chunk.n < 0 || f.chunk.n%4 != 0 || set["chunk-bytes"] && f.chunk.n == 0:
		return usagef("%s: --chunk-bytes must be a positive multiple of 4 bytes, got %d", cmd, f.chunk.n)
	case f.buckets <= 0 || f.buckets > f.size.n/4:
		return usagef("%s: --buckets must be between 1 and the number of values (%d), got %d", cmd, f.size.n/4, f.buckets)
	}
	if _, err := allreduce.ParseSchedule(f.schedule); err != nil {
		return usagef("%s: --schedule: %v", cmd, err)
	}
	if set["codec"] {
		if _, err := compress.Canonical(f.peer.codec); err != nil {
			return usagef("%s: --codec: %v", cmd, err)
		}
	}
	if f.inproc {
		for _, name := range clusterOnly {
			if set[name] {
				return usagef("%s: --%s is for a cluster member; --inproc simulates every peer (use --peers)", cmd, name)
			}
		}
		var stray string
		f.peer.fs.VisitAll(func(fl *flag.Flag) {
			if stray == "" && set[fl.Name] && fl.Name != "codec" && isPeerFlag(fl.Name) {
				stray = fl.Name
			}
		})
		if stray != "" {
			return usagef("%s: --%s starts a real peer; it does not apply with --inproc", cmd, stray)
		}
		if err := flagLimits(cmd, func(c *config.Config) { c.Node.MaxPeers = f.peers },
			flagLimit{"node.max_peers", "--peers", fromDefault(set["peers"])}); err != nil {
			return err // at most node.max_peers' largest value: the ring of a real cluster is as large
		}
		switch {
		case len(f.bandwidth.rates) > 1 && len(f.bandwidth.rates) != f.peers:
			return usagef("%s: --bandwidth has %d rates for %d peers (give one, or one per peer)", cmd, len(f.bandwidth.rates), f.peers)
		case f.latency < 0:
			return usagef("%s: --latency must not be negative, got %v", cmd, f.latency)
		}
		return f.checkLinks(cmd)
	}
	if err := f.checkLinks(cmd); err != nil {
		return err
	}
	for _, name := range inprocOnly {
		if set[name] {
			return usagef("%s: --%s needs --inproc (a cluster member measures the real network with --expect peers)", cmd, name)
		}
	}
	switch {
	case f.expect <= 0:
		return usagef("%s: --expect N (the number of peers to wait for) is required without --inproc, got %d", cmd, f.expect)
	case f.expect > 1:
		if err := flagLimits(cmd, func(c *config.Config) { c.Node.MaxPeers = f.expect }, flagLimit{"node.max_peers", "--expect", ""}); err != nil {
			return err
		}
	}
	switch {
	case f.timeout <= 0:
		return usagef("%s: --timeout must be positive, got %v", cmd, f.timeout)
	case f.peer.steps != 0:
		return usagef("%s: --steps: a benchmarking peer does not train", cmd)
	}
	return nil
}

// isPeerFlag reports whether name is one of the flags addPeerFlags defines.
func isPeerFlag(name string) bool {
	probe := flag.NewFlagSet("", flag.ContinueOnError)
	addPeerFlags(probe)
	return probe.Lookup(name) != nil
}

// codecSpec returns the canonical spec of --codec ("none" when absent).
func (f *benchAllreduceFlags) codecSpec() (string, error) {
	spec := "none"
	if setFlags(f.fs)["codec"] {
		spec = f.peer.codec
	}
	return compress.Canonical(spec)
}

// runInproc runs every peer in this process over shaped in-memory links.
func (f *benchAllreduceFlags) runInproc(ctx context.Context, stdout io.Writer) error {
	spec, err := f.codecSpec()
	if err != nil {
		return usagef("bench allreduce: --codec: %v", err)
	}
	var res allreducebench.Result
	err = interruptible(ctx, func() (err error) {
		res, err = allreducebench.Run(ctx, allreducebench.Options{
			Peers:      f.peers,
			SizeBytes:  f.size.n,
			Codec:      spec,
			Schedule:   f.schedule,
			Rounds:     f.rounds,
			Bandwidth:  f.bandwidth.rates,
			Latency:    f.latency,
			ChunkBytes: f.chunk.n,
			Buckets:    f.buckets,
			LinkCodecs: f.links,
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("bench allreduce: %w", err)
	}
	return printBenchResult(stdout, res, f.json)
}

// printBenchResult prints one result: a line, or one JSON object on one line.
func printBenchResult(w io.Writer, r allreducebench.Result, asJSON bool) error {
	if !asJSON {
		_, err := fmt.Fprintln(w, r.String())
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// checkLinks validates --link-codecs.
func (f *benchAllreduceFlags) checkLinks(cmd string) error {
	if f.links != "off" && f.links != "auto" {
		if _, err := allreduce.CanonicalLinkCodec(f.links); err != nil {
			return usagef("%s: --link-codecs: want off, auto or a linear or quantized codec spec: %v", cmd, err)
		}
	}
	return nil
}
