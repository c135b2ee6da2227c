package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/allreducebench"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/p2ptrain/p2ptrain/plan"
)

// A cluster member's benchmark, in the order every peer runs it:
//
//  1. Start a node exactly as `join` does and wait until the adopted ring
//     epoch has --expect members.
//  2. Control all-reduce (fp32) over the members sorted by peer ID: every peer
//     contributes a fingerprint of its settings, so peers started with
//     different --size, --codec, ... fail at once with a clear error instead
//     of hanging; rank 0 (the lowest peer ID, the gossip coordinator)
//     contributes the plan: the ring order (its adopted epoch's, or
//     plan.Choose's for --schedule auto|proportional), the schedule and
//     the shares, so every peer uses the same one even where their views of
//     the epoch or of the link bandwidths differ.
//  3. The measurement session in that order: one warm-up round, then --rounds
//     timed rounds, each after a barrier (a tiny fp32 all-reduce) so that
//     every peer starts it together.
//  4. A last all-reduce gathers every peer's round times, and each round
//     counts as long as its slowest peer took, so every peer prints the
//     same figures.
//
// The benchmark's transports do not use the gossip epoch numbers, which may
// move on while peers start (the coordinator re-plans a ring of unchanged
// members once link figures arrive), but numbers derived from the member set
// (benchEpochs), the same on every peer. The membership is watched
// throughout: if it changes before step 4 (a peer left, died or joined) the
// benchmark fails on every peer. Step 4 itself is not watched: a peer that
// finished it may leave while others still read their last bytes.

// benchEpochs returns the transport epoch numbers of the control and the
// measurement session of a member set: bit 62 set, far above any gossip
// epoch, the measurement's one above the control's (opening a transport
// drops early streams of lower epochs, and the measurement opens second).
func benchEpochs(members []string) (ctrl, measure uint64) {
	h := fnv.New64a()
	for _, m := range members {
		fmt.Fprintln(h, m)
	}
	ctrl = 1<<62 | (h.Sum64()>>24)<<1
	return ctrl, ctrl + 1
}

// barrierLen is the length of the barrier all-reduce.
const barrierLen = 1

// pollInterval is how often membership is polled while waiting and watching.
const pollInterval = 50 * time.Millisecond

// runCluster starts a peer like join, waits for --expect peers, runs the
// benchmark with them, prints the result and leaves.
func (f *benchAllreduceFlags) runCluster(ctx context.Context, stdout, stderr io.Writer) error {
	cfg, err := f.peer.resolve()
	if err != nil {
		return err
	}
	set := setFlags(f.fs)
	if set["chunk-bytes"] {
		cfg.Allreduce.ChunkBytes = f.chunk.n
	}
	schedule := f.schedule
	if !set["schedule"] && cfg.Allreduce.Schedule != "auto" {
		schedule = cfg.Allreduce.Schedule // [allreduce] schedule: auto there means the codec's own
	}
	spec, err := compress.Canonical(cfg.Allreduce.Codec)
	if err != nil {
		return usagef("bench allreduce: --codec: %v", err)
	}
	if f.links != "off" {
		if _, err := allreduce.CanonicalLinkCodec(spec); err != nil {
			return usagef("bench allreduce: --link-codecs %s: %v", f.links, err)
		}
	}
	n, log, leave, err := startPeer(ctx, cfg, stdout, stderr)
	if err != nil {
		return err
	}
	defer leave()
	ep, err := waitForRing(ctx, n, f.expect, f.timeout)
	if err != nil {
		return err
	}
	log.Info("benchmarking the all-reduce", zap.Uint64("epoch", ep.Number), zap.Strings("order", ep.Order),
		zap.Int("size_bytes", f.size.n), zap.String("codec", spec), zap.String("schedule", schedule))
	b := &clusterBench{
		n:        n,
		log:      log,
		ep:       ep,
		cfg:      cfg.Allreduce.Session(log.Named("allreduce")),
		spec:     spec,
		schedule: schedule,
		size:     f.size.n,
		rounds:   f.rounds,
		buckets:  f.buckets,
		links:    f.links,
		linkRate: f.linkRate.rate,
	}
	res, err := b.run(ctx)
	if err != nil {
		return err
	}
	return printBenchResult(stdout, res, f.json)
}

// waitForRing waits until the adopted ring epoch has want members and this
// peer is connected to each of them (the all-reduce streams need a
// connection, and peers learn each other's addresses through gossip).
func waitForRing(ctx context.Context, n *node.Node, want int, timeout time.Duration) (gossip.Epoch, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		_, ep := n.Gossip().Snapshot()
		var unconnected []string
		switch {
		case len(ep.Order) > want:
			return ep, fmt.Errorf("bench allreduce: ring epoch %d has %d peers, more than --expect %d", ep.Number, len(ep.Order), want)
		case len(ep.Order) == want && slices.Contains(ep.Order, n.ID().String()):
			unconnected = notConnected(n, ep.Order)
			if len(unconnected) == 0 {
				return ep, nil
			}
		}
		select {
		case <-ctx.Done():
			return ep, fmt.Errorf("bench allreduce: interrupted while waiting for %d peers: %w", want, ctx.Err())
		case <-deadline.C:
			if len(unconnected) > 0 {
				return ep, fmt.Errorf("bench allreduce: --timeout %v passed: the ring (epoch %d) has --expect %d peers, "+
					"but this peer cannot connect to %v; check that every peer's --listen address is reachable",
					timeout, ep.Number, want, unconnected)
			}
			return ep, fmt.Errorf("bench allreduce: --timeout %v passed waiting for a ring of --expect %d peers: "+
				"the ring (epoch %d) has %d (%v); check --bootstrap, --cluster and --swarm-key on every peer",
				timeout, want, ep.Number, len(ep.Order), ep.Order)
		case <-tick.C:
		}
	}
}

// notConnected returns the peers of ids, other than n, that n has no connection to.
func notConnected(n *node.Node, ids []string) []string {
	var out []string
	for _, id := range ids {
		p, err := peer.Decode(id)
		if err != nil || p == n.ID() {
			continue
		}
		if n.Host().Network().Connectedness(p) != network.Connected {
			out = append(out, id)
		}
	}
	return out
}

// clusterBench is one cluster member's benchmark run.
type clusterBench struct {
	n        *node.Node
	log      *zap.Logger
	ep       gossip.Epoch
	cfg      allreduce.Config
	spec     string
	schedule string // "", ring, direct, allgather, proportional or auto
	links    string // --link-codecs: off, auto or a codec spec
	size     int
	rounds   int
	buckets  int
	// linkRate is this host's link rate in bytes/s (--link-rate; 0: not
	// known), for the link-limited ideal.
	linkRate float64

	self    allreduce.PeerID
	members []string // ep.Order sorted: the control session's ring
	rank    int      // in members
	step    uint64
	armed   atomic.Bool // the membership watch fails the run
}

// errMembersChanged reports that the ring's members changed during the benchmark.
var errMembersChanged = errors.New("the ring's members changed mid-benchmark (a peer left, died or joined)")

// run performs steps 2–4 of the benchmark and returns the result.
func (b *clusterBench) run(ctx context.Context) (allreducebench.Result, error) {
	b.self = allreduce.PeerID(b.n.ID().String())
	b.members = slices.Sorted(slices.Values(b.ep.Order))
	b.rank = slices.Index(b.members, string(b.self))
	ctrlEpoch, measureEpoch := benchEpochs(b.members)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	b.armed.Store(true)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() { b.watch(stop, cancel) })
	defer func() {
		close(stop)
		wg.Wait()
	}()

	if b.schedule == "auto" || b.schedule == "proportional" || b.links != "off" {
		// Plan from measured links: give the background probes time to
		// measure every pair first (each peer waits on its own view; rank
		// 0's plan is the one used).
		waitLinks(ctx, b.n, b.members, linkWait)
	}
	plan, err := b.agree(ctx, ctrlEpoch)
	if err != nil {
		return allreducebench.Result{}, b.explain(ctx, "agreeing on the settings", err)
	}
	peers := make([]allreduce.PeerID, len(plan.order))
	for k, i := range plan.order {
		peers[k] = allreduce.PeerID(b.members[i])
	}
	mep := allreduce.Ring{Number: measureEpoch, Peers: peers, Self: b.self}
	cfg := b.cfg
	cfg.Schedule, cfg.Shares = plan.schedule, plan.shares
	tr := b.n.OpenTransport(mep)
	s, err := allreduce.NewSession(mep, tr, cfg)
	if err != nil {
		tr.Reset(err)
		return allreducebench.Result{}, fmt.Errorf("bench allreduce: %w", err)
	}
	rank := mep.Rank(b.self)
	links, err := allreducebench.LinkCodecs(b.links, b.spec, plan.schedule, plan.edgeMatrix(), plan.order, b.size, b.buckets, rank)
	if err != nil {
		s.Close()
		tr.Reset(err)
		return allreducebench.Result{}, fmt.Errorf("bench allreduce: --link-codecs: %w", err)
	}
	times, own, sent, cpu, err := b.measure(ctx, s, tr, rank, links)
	if err != nil {
		s.Close()
		tr.Reset(err)
		return allreducebench.Result{}, err
	}
	s.Close()
	if err := tr.Close(); err != nil {
		b.log.Debug("closing the measurement transport", zap.Error(err))
	}
	// Report the schedule that ran: a codec's class may override the one
	// asked for (onebit asked to ring runs direct).
	cd, err := compress.New(b.spec, compress.Options{Layout: compress.FlatLayout(1)})
	if err != nil {
		return allreducebench.Result{}, err
	}
	name := string(s.ScheduleFor(cd.Class()))
	if b.schedule == "auto" {
		name = "auto:" + name
	}
	if links != nil {
		name += "+links"
	}
	res := allreducebench.NewResult(b.size, b.spec, name, len(peers), allreducebench.Median(times))
	// The bytes this peer sent at its link's rate: this link's ideal; the
	// run's is the largest any peer reports (bench/compare.sh takes it).
	ideal := 0.0
	if b.linkRate > 0 {
		ideal = sent / b.linkRate
	}
	res.OwnMedianS = own
	return res.WithWire(sent, ideal).WithCPU(cpu.process, b.rounds).WithMachineCPU(cpu.machine, b.rounds), nil
}

// watch fails the run (through cancel) when the members of the adopted ring
// epoch change while armed; it returns when stop is closed.
func (b *clusterBench) watch(stop <-chan struct{}, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		_, ep := b.n.Gossip().Snapshot()
		if !slices.Equal(slices.Sorted(slices.Values(ep.Order)), b.members) && b.armed.Load() {
			cancel(fmt.Errorf("bench allreduce: %w: ring epoch %d %v became epoch %d %v",
				errMembersChanged, b.ep.Number, b.ep.Order, ep.Number, ep.Order))
			return
		}
	}
}

// explain turns a failed collective into the error to report: the
// membership change if that is what stopped it, else the collective's error.
func (b *clusterBench) explain(ctx context.Context, what string, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, errMembersChanged) {
		return fmt.Errorf("%w (while %s: %v)", cause, what, err)
	}
	hint := ""
	if errors.Is(err, allreduce.ErrPeerFailed) || errors.Is(err, allreduce.ErrTimeout) || errors.Is(err, allreduce.ErrAborted) {
		hint = " (a peer died, left or stalled: rerun with every peer)"
	}
	return fmt.Errorf("bench allreduce: %s failed%s: %w", what, hint, err)
}

// benchPlan is what every peer must agree on before measuring.
type benchPlan struct {
	order    []int // measurement ring: indices into members
	schedule allreduce.Schedule
	shares   []float64 // per rank of order; nil: equal
	edges    []float64 // bytes/s of ring edge k, from order[k] to order[k+1]
}

// edgeMatrix returns a link matrix over the members holding only the ring
// edges' rates: what plan.EdgeCodecs needs of the plan.
func (p benchPlan) edgeMatrix() plan.Matrix {
	w := len(p.order)
	m := make(plan.Matrix, w)
	for i := range m {
		m[i] = make([]float64, w)
	}
	for k, r := range p.edges {
		m[p.order[k]][p.order[(k+1)%w]] = r
	}
	return m
}

// localPlan computes this peer's plan from the ring epoch it has adopted
// now and the link figures it knows.
func (b *clusterBench) localPlan() (benchPlan, error) {
	w := len(b.members)
	p := benchPlan{order: make([]int, w)}
	for i := range p.order {
		p.order[i] = i
	}
	// The adopted epoch's order, if it still has these members (the
	// coordinator may have re-planned it since the benchmark started).
	if _, ep := b.n.Gossip().Snapshot(); slices.Equal(slices.Sorted(slices.Values(ep.Order)), b.members) {
		for k, id := range ep.Order {
			p.order[k] = slices.Index(b.members, id)
		}
	}
	switch b.schedule {
	case "auto", "proportional":
		m := linkMatrix(b.n, b.members)
		if b.schedule == "auto" {
			c, err := allreducebench.Choose(b.links, b.spec, m, b.size)
			if err != nil {
				return p, err
			}
			p.order, p.schedule, p.shares = c.Order, c.Schedule, c.Shares
		} else {
			p.order = plan.RingOrder(m)
			rates := plan.PeerRates(m)
			ordered := make([]float64, w)
			for k, i := range p.order {
				ordered[k] = rates[i]
			}
			p.schedule, p.shares = allreduce.ScheduleProportional, plan.Shares(ordered)
		}
	default:
		s, err := allreduce.ParseSchedule(b.schedule)
		if err != nil {
			return p, err
		}
		p.schedule = s
	}
	if b.links != "off" {
		m := linkMatrix(b.n, b.members)
		p.edges = make([]float64, w)
		for k := range p.edges {
			p.edges[k] = m[p.order[k]][p.order[(k+1)%w]]
		}
	}
	return p, nil
}

// linkWait bounds how long a bandwidth-aware plan waits for the background
// probes to have measured every link of the ring.
const linkWait = 20 * time.Second

// waitLinks polls until every pair of the members has a measured throughput,
// the wait runs out, or ctx ends; a plan made earlier would see unknown links.
func waitLinks(ctx context.Context, n *node.Node, members []string, wait time.Duration) {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		m := n.LinkMatrix(members)
		complete := len(m) == len(members)
		for i := range m {
			for j := range m[i] {
				complete = complete && (i == j || m[i][j] > 0)
			}
		}
		if complete {
			return
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// linkMatrix returns the measured throughput between the ring's peers in
// bytes/s (m[i][j] from order[i] to order[j], 0 when unknown), from
// Node.LinkMatrix. Peers whose views differ still agree, because rank 0's
// plan is the one used. With no figure at all every link counts the same,
// which gives the plain ring for auto and equal shares for proportional.
func linkMatrix(n *node.Node, order []string) plan.Matrix {
	if m := n.LinkMatrix(order); len(m) == len(order) {
		for i := range m {
			for j := range m[i] {
				if i != j && m[i][j] > 0 {
					return m
				}
			}
		}
	}
	m := make(plan.Matrix, len(order))
	for i := range m {
		m[i] = make([]float64, len(order))
		for j := range m[i] {
			if i != j {
				m[i][j] = 1
			}
		}
	}
	return m
}

// fingerprint returns the settings every peer must share, as 8 bytes.
func (b *clusterBench) fingerprint() [8]byte {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d|%s|%s|%d|%d|%d|%s", b.size, b.spec, b.schedule, b.rounds, b.buckets, b.cfg.ChunkBytes, b.links)
	var fp [8]byte
	copy(fp[:], h.Sum(nil))
	return fp
}

// agree runs the control all-reduce on transport epoch number ctrlEpoch
// (step 2) and returns rank 0's plan.
//
// The vector holds the 8 fingerprint bytes b_k of every peer, their squares,
// and rank 0's plan (schedule code, order, shares, edge rates in Mbit/s;
// zeros elsewhere). All
// integers stay below 2^24 after summing, so fp32 carries them exactly; the
// peers' settings agree iff W·Σb_k² = (Σb_k)² for every k.
func (b *clusterBench) agree(ctx context.Context, ctrlEpoch uint64) (benchPlan, error) {
	w := len(b.members)
	local, err := b.localPlan()
	if err != nil {
		return local, err
	}
	// Plain hier only: its groups follow from W (explicit hier-… groups have no code).
	codes := []allreduce.Schedule{allreduce.ScheduleAuto, allreduce.ScheduleRing, allreduce.ScheduleDirect,
		allreduce.ScheduleAllGather, allreduce.ScheduleProportional, allreduce.ScheduleHierarchical}
	const fpLen = 8
	vec := make([]float32, 2*fpLen+1+3*w)
	fp := b.fingerprint()
	for k, x := range fp {
		vec[k], vec[fpLen+k] = float32(x), float32(int(x)*int(x))
	}
	plan := vec[2*fpLen:]
	if b.rank == 0 {
		plan[0] = float32(slices.Index(codes, local.schedule))
		for k, i := range local.order {
			plan[1+k] = float32(i)
		}
		for k, s := range local.shares {
			plan[1+w+k] = float32(s)
		}
		for k, r := range local.edges {
			plan[1+2*w+k] = float32(r * 8 / 1e6)
		}
	}
	ep := allreduce.Ring{Number: ctrlEpoch, Self: b.self}
	for _, p := range b.members {
		ep.Peers = append(ep.Peers, allreduce.PeerID(p))
	}
	cfg := allreduce.Config{FrameTimeout: max(b.cfg.FrameTimeout, 30*time.Second), Logger: b.cfg.Logger}
	tr := b.n.OpenTransport(ep)
	s, err := allreduce.NewSession(ep, tr, cfg)
	if err != nil {
		tr.Reset(err)
		return local, err
	}
	out, err := b.allReduce(ctx, s, vec)
	s.Close()
	if err != nil {
		tr.Reset(err)
		return local, err
	}
	if err := tr.Close(); err != nil {
		b.log.Debug("closing the control transport", zap.Error(err))
	}
	sum := func(i int) int64 { return int64(math.Round(float64(out[i]) * float64(w))) }
	for k := range fpLen {
		if s, sq := sum(k), sum(fpLen+k); int64(w)*sq != s*s {
			return local, fmt.Errorf("the peers were started with different benchmark settings " +
				"(--size, --codec, --schedule, --rounds, --buckets or --chunk-bytes): give every peer the same")
		}
	}
	got := benchPlan{order: make([]int, w)}
	code := sum(2 * fpLen)
	if code < 0 || int(code) >= len(codes) {
		return local, fmt.Errorf("rank 0 sent schedule code %d", code)
	}
	got.schedule = codes[code]
	seen := make([]bool, w)
	for k := range got.order {
		i := sum(2*fpLen + 1 + k)
		if i < 0 || int(i) >= w || seen[i] {
			return local, fmt.Errorf("rank 0 sent an invalid ring order")
		}
		seen[i] = true
		got.order[k] = int(i)
	}
	if got.schedule == allreduce.ScheduleProportional {
		got.shares = make([]float64, w)
		total := 0.0
		for k := range got.shares {
			got.shares[k] = max(0, float64(out[2*fpLen+1+w+k])*float64(w))
			total += got.shares[k]
		}
		if !(total > 0) {
			return local, fmt.Errorf("rank 0 sent shares that sum to %v", total)
		}
		for k := range got.shares {
			got.shares[k] /= total // the same bits on every peer, so the same shares
		}
	}
	if local.edges != nil {
		got.edges = make([]float64, w)
		for k := range got.edges {
			// The same bits on every peer, so the same per-link codecs.
			got.edges[k] = max(0, float64(out[2*fpLen+1+2*w+k])*float64(w)) * 1e6 / 8
		}
	}
	if !slices.Equal(got.order, local.order) || got.schedule != local.schedule {
		b.log.Info("using rank 0's plan", zap.Ints("order", got.order), zap.String("schedule", string(got.schedule)),
			zap.Ints("local_order", local.order), zap.String("local_schedule", string(local.schedule)))
	}
	return got, nil
}

// allReduce averages data over the session's peers as one fp32 bucket and
// returns the result.
func (b *clusterBench) allReduce(ctx context.Context, s *allreduce.Session, data []float32) ([]float32, error) {
	c, err := compress.New("none", compress.Options{Layout: compress.FlatLayout(len(data))})
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(data))
	b.step++
	if err := s.AllReduce(ctx, b.step, allreduce.Bucket{ID: 0, Codec: c, Data: data, Out: out}); err != nil {
		return nil, err
	}
	return out, nil
}

// cpuUse is the CPU time a benchmark's timed rounds took: this process's,
// and the whole machine's (allreducebench.MachineCPU).
type cpuUse struct{ process, machine time.Duration }

// measure runs the warm-up and timed rounds (step 3) and the gathering of
// the times (step 4) on the measurement session; it returns the slowest
// peer's time of each timed round in seconds, this peer's own median, the bytes this peer sent per timed
// round and the CPU time this process used over the timed rounds (counted
// like the bytes, from barrier to barrier).
func (b *clusterBench) measure(ctx context.Context, s *allreduce.Session, tr allreduce.EpochTransport, rank int, links []*allreduce.LinkCodecs) ([]float64, float64, float64, cpuUse, error) {
	n := b.size / 4
	bounds := make([]int, b.buckets+1)
	for i := range bounds {
		bounds[i] = i * n / b.buckets
	}
	r := rand.New(rand.NewPCG(uint64(rank), 99))
	data := make([]float32, n)
	for i := range data {
		data[i] = float32(r.NormFloat64())
	}
	out := make([]float32, n)
	codecs := make([]compress.Codec, b.buckets)
	for i := range codecs {
		c, err := compress.New(b.spec, compress.Options{Layout: compress.FlatLayout(bounds[i+1] - bounds[i]),
			Seed: uint64(rank + 1), SharedSeed: 7})
		if err != nil {
			return nil, 0, 0, cpuUse{}, fmt.Errorf("bench allreduce: --codec: %w", err)
		}
		codecs[i] = c
	}
	barrier := make([]float32, barrierLen)
	times := make([]float32, b.rounds)
	// The bytes sent are counted from the barrier before the first timed
	// round to one after the last: a round's last frames may still be
	// going out when Wait returns here, and the barrier after a round
	// completes only once they went (one stream per neighbour, in order).
	// The barriers' own bytes, measured on the first, are taken off.
	var sentFrom, barrierBytes uint64
	var cpu cpuUse
	for round := -1; round < b.rounds; round++ {
		what := "the warm-up round"
		if round >= 0 {
			what = fmt.Sprintf("timed round %d of %d", round+1, b.rounds)
		}
		before := tr.Sent()
		if _, err := b.allReduce(ctx, s, barrier); err != nil {
			return nil, 0, 0, cpuUse{}, b.explain(ctx, "the barrier before "+what, err)
		}
		switch round {
		case -1:
			barrierBytes = tr.Sent() - before
		case 0:
			sentFrom, cpu = tr.Sent(), cpuUse{allreducebench.ProcessCPU(), allreducebench.MachineCPU()}
		}
		b.step++
		start := time.Now()
		rd := s.NewRound(ctx, b.step)
		for i := b.buckets - 1; i >= 0; i-- {
			lo, hi := bounds[i], bounds[i+1]
			bk := allreduce.Bucket{ID: uint32(i), Codec: codecs[i], Data: data[lo:hi], Out: out[lo:hi], InPlace: true} // as the trainer's
			if links != nil {
				bk.Links = links[i]
			}
			if err := rd.Add(bk); err != nil {
				break // Wait reports it
			}
		}
		if err := rd.Wait(); err != nil {
			return nil, 0, 0, cpuUse{}, b.explain(ctx, what, err)
		}
		if round >= 0 {
			times[round] = float32(time.Since(start).Seconds())
		}
	}
	if _, err := b.allReduce(ctx, s, barrier); err != nil {
		return nil, 0, 0, cpuUse{}, b.explain(ctx, "the barrier after the timed rounds", err)
	}
	cpu = cpuUse{allreducebench.ProcessCPU() - cpu.process, allreducebench.MachineCPU() - cpu.machine}
	// This peer's own bytes: with proportional shares or per-link codecs
	// peers send different amounts, and the ideal is the busiest link's.
	var sentPerRound float64
	if sent := tr.Sent() - sentFrom; sent > uint64(b.rounds)*barrierBytes {
		sentPerRound = float64(sent-uint64(b.rounds)*barrierBytes) / float64(b.rounds)
	}
	// Others may finish step 4 and leave while this peer still reads its
	// last bytes: the epoch change that follows is no failure.
	b.armed.Store(false)
	if err := context.Cause(ctx); errors.Is(err, errMembersChanged) {
		return nil, 0, 0, cpuUse{}, err
	}
	own := make([]float64, len(times))
	for i, t := range times {
		own[i] = float64(t)
	}
	res, err := b.slowest(ctx, s, rank, times)
	if err != nil {
		return nil, 0, 0, cpuUse{}, b.explain(ctx, "gathering the round times", err)
	}
	return res, allreducebench.Median(own), sentPerRound, cpu, nil
}

// slowest returns, for each timed round, the longest time any peer took
// (times are this peer's, rank its rank): a round is done when every peer
// has its result. (Their mean, used before, let a link-bound round read
// faster than its link: a peer's own time ends when its result is in,
// while its last frames may still wait in its socket buffer for the next
// peer; on the slow link of 1 × 100 Mbit/s + 3 × 1 Gbit/s the ring read
// 1.03 of TCP's goodput.) Each peer all-reduces its times in its own rank's
// slots, the others' zero, so the average times the peer count is every
// peer's times.
func (b *clusterBench) slowest(ctx context.Context, s *allreduce.Session, rank int, times []float32) ([]float64, error) {
	w := len(s.Ring().Peers)
	all := make([]float32, w*len(times))
	copy(all[rank*len(times):], times)
	avg, err := b.allReduce(ctx, s, all)
	if err != nil {
		return nil, err
	}
	res := make([]float64, len(times))
	for p := range w {
		for i := range times {
			res[i] = max(res[i], float64(avg[p*len(times)+i])*float64(w))
		}
	}
	return res, nil
}
