package allreducebench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/memtransport"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/plan"
)

// ScaleOptions configure Scale: the flat ring against the planner's
// hierarchical layout, both over a simulated cluster in which every
// peer's interface runs at Rate and every pair of peers is RTT apart (or,
// with RackSize, RackRTT inside a rack and RTT between racks).
type ScaleOptions struct {
	// Peers is the number of peers (default 16).
	Peers int
	// SizeBytes is the fp32 bucket the figures stand for (default 64 MiB).
	SizeBytes int
	// Rate is each peer's interface rate in bytes/s, both directions
	// (default 1 Gbit/s).
	Rate float64
	// RTT is the round-trip time between peers of different racks, or
	// between any two when RackSize is 0 (default 50 ms). A frame takes
	// RTT/2 across a link.
	RTT time.Duration
	// RackSize, when positive, puts consecutive peers in racks of this many,
	// whose members are RackRTT apart.
	RackSize int
	RackRTT  time.Duration
	// Scale divides the bucket, the rate and the pipeline chunk alike, which
	// leaves every α–β time unchanged but for the 36-byte frame headers,
	// which do not shrink (they add at most HeaderSize/chunk to the byte
	// terms). 0 picks the smallest power of two that keeps the buckets of
	// all peers within MemoryBytes.
	Scale int
	// MemoryBytes bounds Peers·SizeBytes/Scale when Scale is 0 (default
	// 256 MiB).
	MemoryBytes int
	// ChunkBytes is the pipeline chunk before scaling (default
	// allreduce.DefaultChunkBytes).
	ChunkBytes int
	// Rounds timed (default 3) after one warm-up round. In virtual time
	// every round takes the same time (ScaleResult.Spread).
	Rounds int
}

func (o ScaleOptions) withDefaults() ScaleOptions {
	if o.Peers <= 0 {
		o.Peers = 16
	}
	if o.SizeBytes <= 0 {
		o.SizeBytes = 64 << 20
	}
	if o.Rate <= 0 {
		o.Rate = 1e9 / 8
	}
	if o.RTT <= 0 {
		o.RTT = 50 * time.Millisecond
	}
	if o.MemoryBytes <= 0 {
		o.MemoryBytes = 256 << 20
	}
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = allreduce.DefaultChunkBytes
	}
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Scale <= 0 {
		o.Scale = 1
		for o.Peers*(o.SizeBytes/o.Scale) > o.MemoryBytes && o.SizeBytes/o.Scale >= 8<<10 {
			o.Scale *= 2
		}
	}
	return o
}

// rtt returns the round-trip time between peers i and j.
func (o ScaleOptions) rtt(i, j int) time.Duration {
	if o.RackSize > 0 && i/o.RackSize == j/o.RackSize {
		return o.RackRTT
	}
	return o.RTT
}

// ScaleResult is one row of the scale table.
type ScaleResult struct {
	Peers     int `json:"peers"`
	SizeBytes int `json:"size_bytes"`
	// Scale is the factor the bucket, rate and chunk were divided by.
	Scale int `json:"scale"`
	// Groups is the hierarchical layout the planner found (its schedule
	// name), Chosen what the planner picks: it or "ring".
	Groups string `json:"groups"`
	Chosen string `json:"chosen"`
	// RingS and HierS are the measured medians (virtual time under
	// testing/synctest); the Model figures are allreduce.Model's at the
	// simulated (scaled) sizes, the Unscaled ones at SizeBytes.
	RingS         float64 `json:"ring_s"`
	RingModelS    float64 `json:"ring_model_s"`
	RingUnscaledS float64 `json:"ring_unscaled_model_s"`
	HierS         float64 `json:"hier_s"`
	HierModelS    float64 `json:"hier_model_s"`
	HierUnscaledS float64 `json:"hier_unscaled_model_s"`
	RTTMs         float64 `json:"rtt_ms"`
	RackSize      int     `json:"rack_size,omitempty"`
	RackRTTMs     float64 `json:"rack_rtt_ms,omitempty"`
	RateGbitS     float64 `json:"rate_gbit_s"`
	ChunkBytes    int     `json:"chunk_bytes"`
	// Spread is the largest (slowest − fastest)/median of the rounds of
	// either schedule, the warm-up included: 0 in virtual time, where every
	// round takes the same time.
	Spread float64 `json:"spread"`
}

// Speedup is the flat ring's measured time over the hierarchy's.
func (r ScaleResult) Speedup() float64 { return r.RingS / r.HierS }

// ModelError returns measured/model − 1 of the ring and the hierarchy.
func (r ScaleResult) ModelError() (ring, hier float64) {
	return r.RingS/r.RingModelS - 1, r.HierS/r.HierModelS - 1
}

// Scale measures the flat ring (peers in rack order) and the hierarchical
// layout that plan.ChooseHierarchical picks from the cluster's rates and
// round trips, both for an fp32 bucket over memtransport with exact pacing,
// and predicts both with allreduce.Model. It uses the real clock: inside a
// testing/synctest bubble the times are the network model's alone (no CPU
// time), which is what the α–β model describes.
func Scale(ctx context.Context, o ScaleOptions) (ScaleResult, error) {
	o = o.withDefaults()
	w := o.Peers
	res := ScaleResult{Peers: w, SizeBytes: o.SizeBytes, Scale: o.Scale, RTTMs: ms(o.RTT), RackSize: o.RackSize,
		RateGbitS: o.Rate * 8 / 1e9, ChunkBytes: o.ChunkBytes}
	if o.RackSize > 0 {
		res.RackRTTMs = ms(o.RackRTT)
	}
	bwm, rtt := make(plan.Matrix, w), make(plan.Matrix, w)
	for i := range bwm {
		bwm[i], rtt[i] = make([]float64, w), make([]float64, w)
		for j := range bwm[i] {
			if i != j {
				bwm[i][j], rtt[i][j] = o.Rate, o.rtt(i, j).Seconds()
			}
		}
	}
	choice := plan.ChooseHierarchical(bwm, rtt, o.SizeBytes, o.ChunkBytes)
	if choice.Groups == nil {
		return res, fmt.Errorf("%w: no hierarchical layout for %d peers", allreduce.ErrConfig, w)
	}
	hier := allreduce.HierarchicalSchedule(choice.Groups)
	res.Groups, res.Chosen = string(hier), string(choice.Schedule)

	size, chunk, rate := o.SizeBytes/o.Scale/4*4, max(o.ChunkBytes/o.Scale/4*4, 4), o.Rate/float64(o.Scale)
	flat := make([]int, w)
	for i := range flat {
		flat[i] = i
	}
	scaled := func(order []int) allreduce.Model { return o.model(order, rate, chunk) }
	res.RingModelS = scaled(flat).Ring(w, size)
	res.HierModelS = scaled(choice.HierOrder).Hierarchical(choice.Groups, size)
	res.RingUnscaledS = o.model(flat, o.Rate, o.ChunkBytes).Ring(w, o.SizeBytes)
	res.HierUnscaledS = o.model(choice.HierOrder, o.Rate, o.ChunkBytes).Hierarchical(choice.Groups, o.SizeBytes)

	data := make([][]float32, w)
	for i := range data {
		r := rand.New(rand.NewPCG(uint64(i), 17))
		data[i] = make([]float32, size/4)
		for k := range data[i] {
			data[i][k] = float32(r.NormFloat64())
		}
	}
	for _, run := range []struct {
		order []int
		sch   allreduce.Schedule
		out   *float64
	}{{flat, allreduce.ScheduleRing, &res.RingS}, {choice.HierOrder, hier, &res.HierS}} {
		times, err := o.simulate(ctx, run.order, run.sch, data, size, chunk, rate)
		if err != nil {
			return res, fmt.Errorf("%s: %w", run.sch, err)
		}
		*run.out = Median(times[1:])
		res.Spread = max(res.Spread, (slices.Max(times)-slices.Min(times)) / *run.out)
	}
	return res, nil
}

// ScaleTable formats rows as a Markdown table.
func ScaleTable(rows []ScaleResult) string {
	var b strings.Builder
	b.WriteString("| peers | RTT | link | simulated bucket | flat ring: measured / model | hierarchical: planner's groups, measured / model | speed-up | planner picks | model unscaled: ring / hierarchical |\n")
	b.WriteString("|---:|---|---|---|---|---|---:|---|---|\n")
	for _, r := range rows {
		rtt := fmt.Sprintf("%g ms", r.RTTMs)
		if r.RackSize > 0 {
			rtt = fmt.Sprintf("%g ms between racks of %d, %g ms inside", r.RTTMs, r.RackSize, r.RackRTTMs)
		}
		size := FormatBytes(r.SizeBytes)
		if r.Scale > 1 {
			size = fmt.Sprintf("%s ÷ %d = %s", size, r.Scale, FormatBytes(r.SizeBytes/r.Scale/4*4))
		}
		re, he := r.ModelError()
		fmt.Fprintf(&b, "| %d | %s | %g Gbit/s | %s | %.3f s / %.3f s (%+.1f %%) | %s: %.3f s / %.3f s (%+.1f %%) | %.2f× | %s | %.3f s / %.3f s |\n",
			r.Peers, rtt, r.RateGbitS, size, r.RingS, r.RingModelS, 100*re, r.Groups, r.HierS, r.HierModelS, 100*he, r.Speedup(), r.Chosen,
			r.RingUnscaledS, r.HierUnscaledS)
	}
	return b.String()
}

func ms(d time.Duration) float64 { return d.Seconds() * 1e3 }

// model is the α–β model of the ring through the peers in order.
func (o ScaleOptions) model(order []int, rate float64, chunk int) allreduce.Model {
	return allreduce.Model{ChunkBytes: chunk, Link: func(a, b int) allreduce.Link {
		return allreduce.Link{Alpha: o.rtt(order[a], order[b]).Seconds() / 2, Beta: rate}
	}}
}

// simulate runs 1 + o.Rounds all-reduces of data (peer i's gradient is
// data[i]) with the ring through the peers in order and schedule sch, and
// returns the time of each, the warm-up first. Every peer must end with
// the same bits.
func (o ScaleOptions) simulate(ctx context.Context, order []int, sch allreduce.Schedule, data [][]float32, size, chunk int, rate float64) ([]float64, error) {
	w := len(order)
	cfg := allreduce.Config{ChunkBytes: chunk, Schedule: sch, TimeoutFloor: time.Hour}
	net := memtransport.New(memtransport.Options{MaxFrame: cfg.MaxFrame(), Exact: true})
	peers := make([]allreduce.PeerID, w)
	for k, i := range order {
		peers[k] = allreduce.PeerID(fmt.Sprintf("peer-%d", i))
		net.SetShape(peers[k], memtransport.Shape{Up: rate, Down: rate})
	}
	for a, i := range order {
		for b, j := range order {
			if a != b {
				net.SetDelay(peers[a], peers[b], o.rtt(i, j)/2)
			}
		}
	}
	sessions := make([]*allreduce.Session, w)
	for k, p := range peers {
		s, err := allreduce.NewSession(allreduce.Ring{Number: 1, Peers: peers, Self: p}, net.Endpoint(p), cfg)
		if err != nil {
			return nil, err
		}
		defer s.Close()
		sessions[k] = s
	}
	out := make([][]float32, w)
	codecs := make([]compress.Codec, w)
	for k := range out {
		out[k] = make([]float32, size/4)
		cd, err := newCodec("none", size/4, k)
		if err != nil {
			return nil, err
		}
		codecs[k] = cd
	}
	var times []float64
	for round := 0; round <= o.Rounds; round++ {
		start := time.Now()
		errs := make([]error, w)
		var wg sync.WaitGroup
		for k, i := range order {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[k] = sessions[k].AllReduce(ctx, uint64(round), allreduce.Bucket{Codec: codecs[k], Data: data[i], Out: out[k]})
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return nil, err
			}
		}
		times = append(times, time.Since(start).Seconds())
	}
	for k := 1; k < w; k++ {
		for x := range out[k] {
			if math.Float32bits(out[k][x]) != math.Float32bits(out[0][x]) {
				return nil, fmt.Errorf("peer %s's average differs from peer %s's at %d", peers[k], peers[0], x)
			}
		}
	}
	return times, nil
}
