// Package allreducebench is the in-process all-reduce benchmark behind
// `p2ptrain bench allreduce`: N peers, each with its own Session, over
// memtransport links shaped to per-peer bandwidth and latency.
//
// Run uses the real clock (simulated links pace with timers), so figures
// include encode/decode CPU time of all peers sharing this machine. Inside a
// testing/synctest bubble the same code measures the network model alone.
package allreducebench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/memtransport"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/plan"
)

// Options configure a benchmark run.
type Options struct {
	// Peers is the number of peers (default 4).
	Peers int
	// SizeBytes is the fp32 buffer size in bytes (default 64 MiB).
	SizeBytes int
	// Codec is the codec spec (default "none").
	Codec string
	// Schedule: "" (class default), ring, direct, allgather, proportional
	// (shares from the bandwidths), or "auto" (plan.Choose picks ring or
	// proportional and the ring order).
	Schedule string
	// Rounds timed (default 5); one untimed warm-up round runs first.
	Rounds int
	// Bandwidth is each peer's interface rate in bytes/s, both directions
	// (one value for all, or one per peer; 0 or empty: unlimited).
	Bandwidth []float64
	// Latency is added to every frame.
	Latency time.Duration
	// ChunkBytes overrides the pipeline chunk (0: default).
	ChunkBytes int
	// Buckets splits the buffer into this many fusion buckets (default 1).
	Buckets int
	// LinkCodecs gives the ring schedule per-link codecs from the
	// bandwidths (plan.EdgeCodecs): "" or "off" for none, "auto" for
	// the automatic choice, or a spec used on every slow link.
	LinkCodecs string
}

// Result is one benchmark outcome (`--json` prints it).
type Result struct {
	SizeBytes int     `json:"size_bytes"`
	Codec     string  `json:"codec"`
	Schedule  string  `json:"schedule"`
	Peers     int     `json:"peers"`
	MedianS   float64 `json:"median_s"`
	// OwnMedianS is, in a cluster, this peer's own median round time (its
	// round ends when its result is in; MedianS's when every peer's is):
	// how far it lies below MedianS shows the stragglers (0: not measured).
	OwnMedianS float64 `json:"own_median_s,omitempty"`
	// AlgBWGbps is size / median time, in Gbit/s.
	AlgBWGbps float64 `json:"algbw_gbps"`
	// BusBWGbps is AlgBW · 2(W−1)/W (the nccl-tests convention), in Gbit/s.
	BusBWGbps float64 `json:"busbw_gbps"`
	// WireBytes is what one peer put on the wire per all-reduce (frames
	// with their length prefixes; the most any peer sent).
	WireBytes float64 `json:"wire_bytes_per_peer"`
	// IdealS is the link-limited ideal: the time the busiest link needs
	// for the bytes it carried at its rate (0: the rates are not known).
	IdealS float64 `json:"ideal_s,omitempty"`
	// Efficiency is IdealS / MedianS (0 when IdealS is not known).
	Efficiency float64 `json:"efficiency,omitempty"`
	// CPUSPerGB is the CPU time (user and system) one peer's process used
	// over the timed rounds per GB (1e9 bytes) of buffer all-reduced: the
	// CPU cost per byte (0: not measured). In-process, the whole process's
	// time divided by the peers.
	CPUSPerGB float64 `json:"cpu_s_per_gb,omitempty"`
	// MachineCPUSPerGB is the busy CPU time of the whole machine (every
	// process, and the kernel's interrupt work; MachineCPU) over the timed
	// rounds per GB of buffer all-reduced (0: not measured). Where every
	// peer runs on one machine, divided by the peers it is each one's share,
	// counted alike for any program measured the same way.
	MachineCPUSPerGB float64 `json:"machine_cpu_s_per_gb,omitempty"`
}

// WithCPU returns r with CPUSPerGB for cpu spent on rounds all-reduces of
// r's buffer (0 when cpu or rounds is 0: not measured).
func (r Result) WithCPU(cpu time.Duration, rounds int) Result {
	r.CPUSPerGB = r.perGB(cpu, rounds)
	return r
}

// perGB is cpu spent on rounds all-reduces of r's buffer per GB (1e9
// bytes) all-reduced; 0 when cpu or rounds is 0: not measured.
func (r Result) perGB(cpu time.Duration, rounds int) float64 {
	if gb := float64(r.SizeBytes) * float64(rounds) / 1e9; cpu > 0 && gb > 0 {
		return cpu.Seconds() / gb
	}
	return 0
}

// WithMachineCPU returns r with MachineCPUSPerGB for the machine's busy
// CPU time over rounds all-reduces of r's buffer (0 when not measured).
func (r Result) WithMachineCPU(cpu time.Duration, rounds int) Result {
	r.MachineCPUSPerGB = r.perGB(cpu, rounds)
	return r
}

// WithWire returns r with the bytes a peer sent per all-reduce and the
// link-limited ideal time (0: unknown), and the efficiency they give.
func (r Result) WithWire(bytesPerPeer, idealS float64) Result {
	r.WireBytes, r.IdealS, r.Efficiency = bytesPerPeer, idealS, 0
	if idealS > 0 && r.MedianS > 0 {
		r.Efficiency = idealS / r.MedianS
	}
	return r
}

// IdealSeconds is the link-limited time of one all-reduce: each peer's
// link carries sent[i] bytes out and received[i] bytes in at rate[i]
// bytes/s in each direction, and the busiest link bounds the time. It is
// 0 when a rate is not known (0).
func IdealSeconds(sent, received, rate []float64) float64 {
	ideal := 0.0
	for i := range rate {
		if rate[i] <= 0 {
			return 0
		}
		ideal = max(ideal, sent[i]/rate[i], received[i]/rate[i])
	}
	return ideal
}

// String formats r on one line.
func (r Result) String() string {
	line := fmt.Sprintf("size %s  codec %s  schedule %s  peers %d  median %.4fs  algbw %.3f Gbit/s  busbw %.3f Gbit/s  sent/peer %.2f MB",
		FormatBytes(r.SizeBytes), r.Codec, r.Schedule, r.Peers, r.MedianS, r.AlgBWGbps, r.BusBWGbps, r.WireBytes/1e6)
	if r.IdealS > 0 {
		line += fmt.Sprintf("  ideal %.4fs  efficiency %.2f", r.IdealS, r.Efficiency)
	}
	if r.CPUSPerGB > 0 {
		line += fmt.Sprintf("  cpu %.2f s/GB", r.CPUSPerGB)
	}
	return line
}

// FormatBytes writes n as B, KiB, MiB or GiB.
func FormatBytes(n int) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// NewResult fills a Result from the measured median.
func NewResult(size int, codec, schedule string, peers int, median float64) Result {
	r := Result{SizeBytes: size, Codec: codec, Schedule: schedule, Peers: peers, MedianS: median}
	if median > 0 {
		r.AlgBWGbps = float64(size) * 8 / median / 1e9
		r.BusBWGbps = r.AlgBWGbps * 2 * float64(peers-1) / float64(peers)
	}
	return r
}

// Median returns the median of xs (0 for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Run performs the benchmark.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Peers <= 0 {
		o.Peers = 4
	}
	if o.SizeBytes <= 0 {
		o.SizeBytes = 64 << 20
	}
	if o.Codec == "" {
		o.Codec = "none"
	}
	if o.Rounds <= 0 {
		o.Rounds = 5
	}
	if o.Buckets <= 0 {
		o.Buckets = 1
	}
	spec, err := compress.Canonical(o.Codec)
	if err != nil {
		return Result{}, err
	}
	w := o.Peers
	rates := make([]float64, w)
	for i := range rates {
		switch {
		case len(o.Bandwidth) == 1:
			rates[i] = o.Bandwidth[0]
		case len(o.Bandwidth) == w:
			rates[i] = o.Bandwidth[i]
		case len(o.Bandwidth) != 0:
			return Result{}, fmt.Errorf("%w: %d bandwidths for %d peers", allreduce.ErrConfig, len(o.Bandwidth), w)
		}
	}
	peers := make([]allreduce.PeerID, w)
	for i := range peers {
		peers[i] = allreduce.PeerID(fmt.Sprintf("peer-%d", i))
	}
	cfg := allreduce.Config{ChunkBytes: o.ChunkBytes, TimeoutFloor: time.Hour}
	schedName := o.Schedule
	switch o.Schedule {
	case "auto", "proportional":
		m := rateMatrix(rates)
		var order []int
		var shares []float64
		if o.Schedule == "auto" {
			p, err := Choose(o.LinkCodecs, spec, m, o.SizeBytes)
			if err != nil {
				return Result{}, err
			}
			order, shares = p.Order, p.Shares
			cfg.Schedule = p.Schedule
			schedName = "auto:" + string(p.Schedule)
		} else {
			order = plan.RingOrder(m)
			r := make([]float64, w)
			for k, i := range order {
				r[k] = bw(rates[i])
			}
			shares = plan.Shares(r)
			cfg.Schedule = allreduce.ScheduleProportional
		}
		cfg.Shares = shares
		np := make([]allreduce.PeerID, w)
		nr := make([]float64, w)
		for k, i := range order {
			np[k], nr[k] = peers[i], rates[i]
		}
		peers, rates = np, nr
	default:
		s, err := allreduce.ParseSchedule(o.Schedule)
		if err != nil {
			return Result{}, err
		}
		cfg.Schedule = s
	}

	links, err := linkCodecs(o, spec, cfg.Schedule, rates)
	if err != nil {
		return Result{}, err
	}
	if links != nil {
		schedName += "+links"
	}
	net := memtransport.New(memtransport.Options{MaxFrame: cfg.MaxFrame()})
	for i, p := range peers {
		net.SetShape(p, memtransport.Shape{Up: rates[i], Down: rates[i], Latency: o.Latency})
	}
	n := o.SizeBytes / 4
	sessions := make([]*allreduce.Session, w)
	for i, p := range peers {
		s, err := allreduce.NewSession(allreduce.Ring{Number: 1, Peers: peers, Self: p}, net.Endpoint(p), cfg)
		if err != nil {
			return Result{}, err
		}
		defer s.Close()
		sessions[i] = s
	}
	if schedName == "" {
		cd, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(1)})
		if err != nil {
			return Result{}, err
		}
		schedName = string(sessions[0].ScheduleFor(cd.Class()))
	}
	// Buckets, data and codecs per peer.
	bounds := make([]int, o.Buckets+1)
	for b := range bounds {
		bounds[b] = b * n / o.Buckets
	}
	data := make([][]float32, w)
	out := make([][]float32, w)
	codecs := make([][]compress.Codec, w)
	for i := range data {
		r := rand.New(rand.NewPCG(uint64(i), 99))
		data[i] = make([]float32, n)
		for k := range data[i] {
			data[i][k] = float32(r.NormFloat64())
		}
		out[i] = make([]float32, n)
		for b := 0; b < o.Buckets; b++ {
			cd, err := newCodec(spec, bounds[b+1]-bounds[b], i)
			if err != nil {
				return Result{}, err
			}
			codecs[i] = append(codecs[i], cd)
		}
	}
	var times []float64
	var cpu time.Duration
	for round := 0; round <= o.Rounds; round++ {
		if round == 1 {
			cpu = ProcessCPU()
		}
		start := time.Now()
		errs := make([]error, w)
		var wg sync.WaitGroup
		for i := 0; i < w; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rd := sessions[i].NewRound(ctx, uint64(round))
				for b := o.Buckets - 1; b >= 0; b-- {
					d := data[i][bounds[b]:bounds[b+1]]
					bk := allreduce.Bucket{ID: uint32(b), Codec: codecs[i][b], Data: d, Out: out[i][bounds[b]:bounds[b+1]], InPlace: true} // as the trainer's
					if links != nil {
						bk.Links = links[i][b]
					}
					if err := rd.Add(bk); err != nil {
						break
					}
				}
				errs[i] = rd.Wait()
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return Result{}, err
			}
		}
		if round > 0 {
			times = append(times, time.Since(start).Seconds())
		}
	}
	cpu = ProcessCPU() - cpu
	// Every round sends the same bytes: the warm-up counts as one.
	sent, received := make([]float64, w), make([]float64, w)
	most := 0.0
	for i, p := range peers {
		s, r := net.Traffic(p)
		sent[i], received[i] = float64(s)/float64(o.Rounds+1), float64(r)/float64(o.Rounds+1)
		most = max(most, sent[i])
	}
	res := NewResult(o.SizeBytes, spec, schedName, w, Median(times))
	return res.WithWire(most, IdealSeconds(sent, received, rates)).WithCPU(cpu/time.Duration(w), o.Rounds), nil
}

// newCodec returns peer i's codec of spec for a bucket of n values.
func newCodec(spec string, n, i int) (compress.Codec, error) {
	return compress.New(spec, compress.Options{Layout: compress.FlatLayout(n), Seed: uint64(i + 1), SharedSeed: 7})
}

// rateMatrix returns the link matrix of peers with interface rates: each
// link runs at the slower end's rate.
func rateMatrix(rates []float64) plan.Matrix {
	m := make(plan.Matrix, len(rates))
	for i := range m {
		m[i] = make([]float64, len(rates))
		for j := range m[i] {
			m[i][j] = min(bw(rates[i]), bw(rates[j]))
		}
	}
	return m
}

// linkCodecs returns, per peer (in ring order) and bucket, the per-link
// codecs o.LinkCodecs asks for, or nil for none or a schedule other than
// the ring.
func linkCodecs(o Options, spec string, sch allreduce.Schedule, rates []float64) ([][]*allreduce.LinkCodecs, error) {
	order := make([]int, len(rates))
	for i := range order {
		order[i] = i
	}
	var out [][]*allreduce.LinkCodecs
	for i := range rates {
		lk, err := LinkCodecs(o.LinkCodecs, spec, sch, rateMatrix(rates), order, o.SizeBytes, o.Buckets, i)
		if lk == nil || err != nil {
			return nil, err
		}
		out = append(out, lk)
	}
	return out, nil
}

// LinkCodecs returns the per-link codecs of the peer at rank of ring order
// over m, one per bucket of the benchmark's equal buckets of sizeBytes, for
// mode "auto" (plan.EdgeCodecs' choice) or a codec spec used on the slow
// links. It returns nil for mode "off" (or "") and for schedules other than
// the ring; spec must be a codec with per-link variants.
func LinkCodecs(mode, spec string, sch allreduce.Schedule, m plan.Matrix, order []int, sizeBytes, buckets, rank int) ([]*allreduce.LinkCodecs, error) {
	if mode == "" || mode == "off" {
		return nil, nil
	}
	if _, err := allreduce.CanonicalLinkCodec(spec); err != nil {
		return nil, err
	}
	if sch != allreduce.ScheduleRing && sch != allreduce.ScheduleAuto {
		return nil, nil
	}
	edges, final, err := plan.EdgeCodecs(spec, m, order, overrideOf(mode))
	if err != nil {
		return nil, err
	}
	n := sizeBytes / 4
	out := make([]*allreduce.LinkCodecs, buckets)
	for b := range out {
		size := (b+1)*n/buckets - b*n/buckets
		if out[b], err = allreduce.NewLinkCodecs(edges, final, rank, func(spec string) (compress.Codec, error) {
			return newCodec(spec, size, rank)
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func bw(x float64) float64 {
	if x <= 0 {
		return 1e15
	}
	return x
}

// overrideOf returns the EdgeCodecs override of a per-link codec mode: none
// for "auto", else the mode's codec spec.
func overrideOf(mode string) string {
	if mode == "auto" {
		return ""
	}
	return mode
}

// Choose is the plan of schedule auto: plan.Choose, or with per-link
// codecs on (mode "auto" or a spec, not "off") plan.ChooseLinks, as a
// training cluster's coordinator picks it. spec must then have per-link
// variants.
func Choose(mode, spec string, m plan.Matrix, bytes int) (plan.Choice, error) {
	if mode == "" || mode == "off" {
		return plan.Choose(m, bytes), nil
	}
	spec, err := allreduce.CanonicalLinkCodec(spec)
	if err != nil {
		return plan.Choice{}, err
	}
	p, _, _, err := plan.ChooseLinks(m, bytes, spec, overrideOf(mode))
	return p, err
}
