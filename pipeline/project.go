package pipeline

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/model"
)

// LayerCost is one layer's figures for a projection.
type LayerCost struct {
	// Forward and Backward are its compute seconds per sample.
	Forward, Backward float64
	// Params, Tied, TiedParams and OutElems are as in model.LayerInfo.
	Params, Tied, TiedParams, OutElems int
}

// Costs combines a model's layers (model.Layers) with their times measured
// on a batch of n samples (model.ProfileLayers) into per-sample costs.
func Costs(infos []model.LayerInfo, times []model.LayerTime, n int) ([]LayerCost, error) {
	if len(infos) != len(times) || n < 1 {
		return nil, fmt.Errorf("pipeline: %d layers, %d layer times measured on %d samples", len(infos), len(times), n)
	}
	out := make([]LayerCost, len(infos))
	for i, in := range infos {
		out[i] = LayerCost{Forward: times[i].Forward.Seconds() / float64(n), Backward: times[i].Backward.Seconds() / float64(n),
			Params: in.Params, Tied: in.Tied, TiedParams: in.TiedParams, OutElems: in.OutElems}
	}
	return out, nil
}

// CodecCost is a codec as a projection sees it.
type CodecCost struct {
	// Spec is the codec's canonical spec.
	Spec string
	// Ratio is its encoded size over fp32's.
	Ratio float64
	// AllGather says that a ring carries every peer's payload to every
	// other (sparse codecs) instead of reducing it on the way.
	AllGather bool
	// Code is the processor's seconds to encode one value and decode it
	// once, measured on the peer's device (0: not priced).
	Code float64
	// Ladder, with more than one codec, projects an activation codec under
	// train.activation_link_codecs = "auto": the codecs of Ladder(Spec),
	// this one last, that each hop's sending stage chooses among.
	Ladder []CodecCost
	// codec is an instance of the codec, for the ring's frame count
	// (allreduce.RingFrames; nil: fp32's frames).
	codec compress.Codec
}

// CPUCost is what a peer's processor spends in a step besides its layers'
// forward and backward passes, measured on the peer's device like the
// layer times (docs/pipeline.md). The zero value prices none of it.
type CPUCost struct {
	// Update is the optimizer's seconds per parameter it updates.
	Update float64
	// Message and Byte are the transport's seconds per message and per
	// byte, a send and a receive together (node.WireCost).
	Message, Byte float64
	// Beside says the device computes beside the processor (a GPU): a
	// pipeline's messages then delay their hop instead of taking the
	// stages' compute time. Without it (a CPU device) every message's
	// processor time is a stage's, and the ring's adds to its wire time.
	Beside bool
}

// check returns an error for figures out of range.
func (c CPUCost) check() error {
	for _, v := range []float64{c.Update, c.Message, c.Byte} {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("pipeline: processor costs %+v are out of range (want finite values ≥ 0)", c)
		}
	}
	return nil
}

// message returns the processor time of a message of bytes on the wire
// carrying values values coded with c, both ends together.
func (c CPUCost) message(bytes, values float64, codec CodecCost) float64 {
	return c.Message + bytes*c.Byte + values*codec.Code
}

// CodecCostOf returns the cost of codec spec: its MaxEncodedLen over a
// buffer of 2²⁰ values. Low-rank codecs, whose size depends on the
// tensors' shapes, are not modelled.
func CodecCostOf(spec string) (CodecCost, error) {
	const n = 1 << 20
	c, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(n)})
	if err != nil {
		return CodecCost{}, err
	}
	if c.Class() == compress.ClassLowRank {
		return CodecCost{}, fmt.Errorf("pipeline: the projection does not model low-rank codecs (%s)", c.Spec())
	}
	return CodecCost{Spec: c.Spec(), Ratio: float64(c.MaxEncodedLen(n)) / (4 * n), AllGather: c.Class() == compress.ClassSparse, codec: c}, nil
}

// Setup is what a projection takes: the model's layers, the cluster and
// the step.
type Setup struct {
	Layers []LayerCost
	// Peers is the number of peers P, each with the same device.
	Peers int
	// Batch is the global batch in samples per step; Micro the number of
	// micro-batches M each pipeline cuts its part of the batch into.
	Batch, Micro int
	// Bandwidth is every link's rate in bytes/s, each way; RTT its round
	// trip in seconds.
	Bandwidth, RTT float64
	// Schedule is the pipelines' schedule.
	Schedule Schedule
	// CPU is what the step costs a peer's processor besides its layers.
	CPU CPUCost
	// Idle lets layouts of S stages where S does not divide Peers into
	// the projection: ⌊Peers/S⌋ pipelines train and the other Peers mod S
	// members sit idle (pipeline.Assign's layout). PerPeerBatch, when
	// positive, is the samples each member that trains adds to the global
	// batch (train.batch_size under train.pipeline_stages = "auto"): a
	// layout with idle members then takes a smaller batch than Batch, and
	// Plan ranks layouts by time per sample.
	Idle         bool
	PerPeerBatch int
	// LayoutLinks, when not nil, gives the rates (bytes/s each way) a
	// layout of stages ≥ 2 stages runs on: each hop's between consecutive
	// stages (stages−1 of them: hop h joins stages h and h+1) and its
	// stages' rings' slowest edge, where the cluster lays its pipelines out
	// from measured links (0, or a list of another length: Bandwidth).
	// Bandwidth stays the rate of pure data parallelism's ring and of the
	// tied exchange.
	LayoutLinks func(stages int) (hops []float64, ring float64)
	// Slowdown, when not nil, returns how many times Layers' figures the
	// slowest member a layout of stages stages trains with takes to
	// compute (members with other devices; the members the layout leaves
	// idle do not count): every pipeline waits for its slowest stage and
	// every ring for its slowest replica. Nil, or a factor that is not
	// finite and positive: 1.
	Slowdown func(stages int) float64
}

// slowed returns layers with their compute times f times longer.
func slowed(layers []LayerCost, f float64) []LayerCost {
	if f == 1 || !(f > 0) || math.IsInf(f, 0) {
		return layers
	}
	out := slices.Clone(layers)
	for i := range out {
		out[i].Forward *= f
		out[i].Backward *= f
	}
	return out
}

// hopRates returns the rate of each of the stages−1 hops between stages:
// hops' where LayoutLinks gave one, else Bandwidth.
func (s Setup) hopRates(hops []float64, stages int) []float64 {
	out := make([]float64, stages-1)
	for h := range out {
		out[h] = s.Bandwidth
		if len(hops) == len(out) && hops[h] > 0 && !math.IsInf(hops[h], 0) {
			out[h] = hops[h]
		}
	}
	return out
}

// batchFor returns the global batch of a layout in which working of the
// Peers members train.
func (s Setup) batchFor(working int) int {
	if s.PerPeerBatch > 0 && working < s.Peers {
		return working * s.PerPeerBatch
	}
	return s.Batch
}

// pickCost returns the codec of ladder that a stage computing busy seconds
// a step sends a message of values values with on a link of rate bytes/s,
// by the rule Stage.Step follows (pickCodec with its compute per
// micro-batch).
func (s Setup) pickCost(ladder []CodecCost, values, busy, rate float64) CodecCost {
	sizes := make([]int, len(ladder))
	for i, c := range ladder {
		sizes[i] = int(math.Ceil(values * 4 * c.Ratio))
	}
	per := time.Duration(busy / float64(s.Micro) * float64(time.Second))
	return ladder[pickCodec(sizes, rate, per, len(sizes)-1)]
}

// specsOfCosts lists the codecs' specs.
func specsOfCosts(cs []CodecCost) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Spec
	}
	return out
}

// Layout is the projection of one layout: S stages × R replicas (S = 1 is
// pure data parallelism) with a gradient and an activation codec. Times are
// seconds per step.
type Layout struct {
	Stages, Replicas, Micro int
	// Idle is the members that sit idle (Setup.Idle), Batch the samples
	// the layout trains per step.
	Idle, Batch int
	// HopRates are the link rates (bytes/s) the projection gave each hop
	// between stages (Setup.LayoutLinks, else Bandwidth; nil for S = 1),
	// HopRate the slowest of them (0 for S = 1), and RingRate the rings'.
	HopRates          []float64
	HopRate, RingRate float64
	// Split is the cut of the layers into stages (Balance on each layer's
	// forward pass twice, for the recomputation, plus its backward pass).
	Split Split
	// Grad is the gradient codec ("" without replicas: R = 1), Act the
	// activation codec ("" for S = 1; with its Ladder the ladder's codecs
	// joined by "|").
	Grad, Act string
	// ActLinks is, with an activation codec's Ladder, each hop's codecs of activations
	// and of their gradients, "fwd/back" (nil without).
	ActLinks []string
	// Compute is a peer's compute time (S = 1), or the pipeline's time: its
	// schedule simulated with the stages' compute and the hops' transfers.
	Compute float64
	// Bubble is the fraction of the pipeline's time its busiest stage
	// idles: for S equal stages on free links, about (S−1)/(M+S−1) (less,
	// as recomputations overlap other stages' work).
	Bubble float64
	// Hop is the slowest hop's time for one micro-batch's activation,
	// transfer and one-way latency (RTT/2).
	Hop float64
	// AllReduce is the slowest stage's ring all-reduce of its gradients
	// across its R replicas: 2(R−1)/R × its gradient bytes × the codec's
	// ratio / bandwidth + 2(R−1) × RTT ((R−1) × the payload for an
	// all-gather codec), plus its processor time (Setup.CPU).
	AllReduce float64
	// Tied is the exchange of the shared token table's gradient between the
	// first and the last stage (fp32, one transfer and RTT/2, and its
	// messages' processor time), 0 if none.
	Tied float64
	// Update is the optimizer's step on the largest stage's parameters.
	Update float64
	// CommCPU is the processor time of the communication that Compute,
	// AllReduce and Tied include (the busiest peer's).
	CommCPU float64
	// Step is Compute + Update + AllReduce + Tied.
	Step float64
	// PeerBytes is the most bytes a peer sends per step: activations,
	// activation gradients, its ring's share and the tied table.
	PeerBytes float64
	// PeerParams is the most parameters a peer holds (the largest stage,
	// with a tied copy): what bounds the model size a peer's memory allows.
	PeerParams int
}

// Name returns "S×R", e.g. "2×4", "S×R+I" with I idle members, or "dp×P"
// for S = 1.
func (l Layout) Name() string {
	if l.Stages == 1 {
		return fmt.Sprintf("dp×%d", l.Replicas)
	}
	if l.Idle > 0 {
		return fmt.Sprintf("%d×%d+%d", l.Stages, l.Replicas, l.Idle)
	}
	return fmt.Sprintf("%d×%d", l.Stages, l.Replicas)
}

// ring returns a ring all-reduce's time, the bytes each of r peers sends
// and the processor time included, for a buffer of bytes fp32 bytes under
// codec c. A peer sends and receives as many frames and bytes; each
// frame's and byte's CPU figure covers both ends, so a peer spends it once
// per frame it sends. It codes 2(r−1)/r of the buffer (a segment per step:
// its own contribution, or the sum so far with its own added), or the
// whole buffer once for an all-gather. The processor time adds to the wire
// time: a ring hop forwards a chunk only once it has it all, decoded.
func (s Setup) ring(r int, bytes float64, c CodecCost) (secs, sent, cpu float64) {
	if r <= 1 {
		return 0, 0, 0
	}
	steps := 2 * float64(r-1)
	sent = steps / float64(r) * bytes * c.Ratio
	coded := steps / float64(r) * bytes / 4
	var frames float64
	if c.AllGather {
		steps = float64(r - 1)
		sent = steps * bytes * c.Ratio
		coded = bytes / 4
		frames = steps * math.Ceil(bytes*c.Ratio/allreduce.DefaultChunkBytes)
	} else {
		frames = allreduce.RingFrames(int(bytes/4), r, c.codec, 0)
	}
	cpu = frames*s.CPU.Message + sent*s.CPU.Byte + coded*c.Code
	return sent/s.Bandwidth + steps*s.RTT + cpu, sent, cpu
}

// check returns an error for a setup no layout can run.
func (s Setup) check() error {
	switch {
	case len(s.Layers) == 0:
		return fmt.Errorf("pipeline: projecting a model without layers")
	case s.Peers < 1 || s.Batch < 1 || s.Micro < 1:
		return fmt.Errorf("pipeline: projecting %d peers, batch %d, %d micro-batches: want each at least 1", s.Peers, s.Batch, s.Micro)
	case !(s.Bandwidth > 0) || math.IsInf(s.Bandwidth, 0) || !(s.RTT >= 0) || math.IsInf(s.RTT, 0):
		return fmt.Errorf("pipeline: projecting links of %v bytes/s and RTT %v s: want a positive rate and a finite RTT ≥ 0", s.Bandwidth, s.RTT)
	}
	if err := s.CPU.check(); err != nil {
		return err
	}
	for i, l := range s.Layers {
		if !(l.Forward >= 0 && l.Backward >= 0) || math.IsInf(l.Forward+l.Backward, 0) || l.Params < 0 || l.OutElems < 1 || l.TiedParams < 0 {
			return fmt.Errorf("pipeline: layer %d's figures %+v are out of range", i, l)
		}
	}
	return nil
}

// Project predicts the step time of stages stages × ⌊Peers/stages⌋
// replicas with gradient codec grad and activation codec act (ignored for
// one stage). The layout must be feasible: stages divides Peers (or, with
// Idle, is at most Peers: the rest sit idle), is at most the number of
// layers, and each pipeline's part of the batch holds at least Micro
// samples.
func (s Setup) Project(stages int, grad, act CodecCost) (Layout, error) {
	if err := s.check(); err != nil {
		return Layout{}, err
	}
	if stages < 1 || stages > s.Peers || (!s.Idle && s.Peers%stages != 0) || stages > len(s.Layers) {
		return Layout{}, fmt.Errorf("pipeline: %d stages do not fit %d peers and %d layers", stages, s.Peers, len(s.Layers))
	}
	idle := s.Peers % stages
	s.Batch = s.batchFor(s.Peers - idle)
	s.Peers -= idle
	s.PerPeerBatch = 0
	for _, c := range []CodecCost{grad, act} {
		if !(c.Code >= 0) || math.IsInf(c.Code, 0) {
			return Layout{}, fmt.Errorf("pipeline: codec %s's coding time %v s per value is out of range (want finite, ≥ 0)", c.Spec, c.Code)
		}
	}
	if s.Slowdown != nil {
		s.Layers = slowed(s.Layers, s.Slowdown(stages))
	}
	R := s.Peers / stages
	lay := Layout{Stages: stages, Replicas: R, Idle: idle, Batch: s.Batch, Micro: s.Micro, Grad: grad.Spec, RingRate: s.Bandwidth}
	if R == 1 {
		lay.Grad = "" // no ring
	}
	params := 0
	for _, l := range s.Layers {
		params += l.Params
	}
	if stages == 1 {
		lay.Micro = 1
		per := float64(s.Batch) / float64(s.Peers)
		for _, l := range s.Layers {
			lay.Compute += per * (l.Forward + l.Backward)
		}
		lay.AllReduce, lay.PeerBytes, lay.CommCPU = s.ring(R, 4*float64(params), grad)
		lay.Update = float64(params) * s.CPU.Update
		lay.Step, lay.PeerParams = lay.Compute+lay.Update+lay.AllReduce, params
		return lay, nil
	}
	if s.Batch < R*s.Micro {
		return Layout{}, fmt.Errorf("pipeline: %d replicas × %d micro-batches need a batch of at least %d samples, not %d", R, s.Micro, R*s.Micro, s.Batch)
	}
	lay.Act = act.Spec
	hopBW := s.hopRates(nil, stages)
	if s.LayoutLinks != nil {
		hops, ring := s.LayoutLinks(stages)
		hopBW = s.hopRates(hops, stages)
		if ring > 0 && !math.IsInf(ring, 0) {
			s.Bandwidth = ring // the stages' rings; the tied exchange too
		}
	}
	lay.HopRates, lay.HopRate, lay.RingRate = hopBW, slices.Min(hopBW), s.Bandwidth
	mb := float64(s.Batch) / float64(R*s.Micro) // samples per micro-batch
	weights := make([]float64, len(s.Layers))
	for i, l := range s.Layers {
		weights[i] = 2*l.Forward + l.Backward
	}
	split, _, err := Balance(weights, stages)
	if err != nil {
		return Layout{}, err
	}
	lay.Split = split
	tm := Timing{Latency: s.RTT / 2}
	sent := make([]float64, stages)
	cpu := make([]float64, stages) // each stage's communication CPU
	tiedParams := 0
	for st := range stages {
		lo, hi := split[st], split[st+1]
		var f, b float64
		g := 0
		for i := lo; i < hi; i++ {
			l := s.Layers[i]
			f += l.Forward
			b += l.Backward
			g += l.Params
			if l.Tied >= 0 && (l.Tied < lo || l.Tied >= hi) {
				g += l.TiedParams // a copy of the shared weight
				tiedParams = l.TiedParams
			}
		}
		tm.Forward = append(tm.Forward, mb*f)
		tm.Backward = append(tm.Backward, mb*b)
		secs, ringSent, ringCPU := s.ring(R, 4*float64(g), grad)
		lay.AllReduce = max(lay.AllReduce, secs)
		lay.PeerParams = max(lay.PeerParams, g)
		lay.Update = max(lay.Update, float64(g)*s.CPU.Update)
		sent[st] += ringSent
		cpu[st] += ringCPU
	}
	busy := make([]float64, stages) // each stage's compute time in the step
	for st := range stages {
		ops, _ := s.Schedule.Ops(stages, st, s.Micro)
		for _, op := range ops {
			if op.Kind == Forward || op.Recompute {
				busy[st] += tm.Forward[st]
			}
			if op.Kind == Backward {
				busy[st] += tm.Backward[st]
			}
		}
	}
	links := len(act.Ladder) > 1
	if links {
		lay.Act = strings.Join(specsOfCosts(act.Ladder), "|")
		tm.TransferBack = make([]float64, 0, stages-1)
		if !s.CPU.Beside {
			tm.MessageBack = make([]float64, 0, stages-1)
		}
	}
	if !s.CPU.Beside {
		tm.Message = make([]float64, 0, stages-1)
	}
	for h := range stages - 1 {
		values := mb * float64(s.Layers[split[h+1]-1].OutElems)
		// Each direction carries the codec its sending stage picks.
		fwd, back := act, act
		if links {
			fwd = s.pickCost(act.Ladder, values, busy[h], hopBW[h])
			back = s.pickCost(act.Ladder, values, busy[h+1], hopBW[h])
			lay.ActLinks = append(lay.ActLinks, fwd.Spec+"/"+back.Spec)
		}
		for dir, c := range []CodecCost{fwd, back} {
			bytes := values * 4 * c.Ratio
			transfer := bytes / hopBW[h]
			// Both ends of the hop handle a message of this direction per
			// micro-batch: its processor time, half of it at either end.
			msg := s.CPU.message(bytes, values, c)
			cpu[h] += float64(s.Micro) * msg / 2
			cpu[h+1] += float64(s.Micro) * msg / 2
			if s.CPU.Beside {
				transfer += msg
			} else if dir == 0 {
				tm.Message = append(tm.Message, msg/2)
			} else if links {
				tm.MessageBack = append(tm.MessageBack, msg/2)
			}
			if dir == 0 {
				tm.Transfer = append(tm.Transfer, transfer)
				sent[h] += float64(s.Micro) * bytes // activations forward
			} else {
				if links {
					tm.TransferBack = append(tm.TransferBack, transfer)
				}
				sent[h+1] += float64(s.Micro) * bytes // their gradients back
			}
			lay.Hop = max(lay.Hop, transfer+tm.Latency)
		}
	}
	if lay.Compute, err = s.Schedule.Simulate(tm, s.Micro); err != nil {
		return Layout{}, err
	}
	busiest := slices.Max(busy) // the most compute time a stage spends in the step
	if lay.Compute > 0 {
		lay.Bubble = 1 - busiest/lay.Compute
	}
	if tiedParams > 0 {
		bytes := 4 * float64(tiedParams)
		// Each end sends its part and receives the other's, fp32 both.
		msg := s.CPU.message(bytes, 0, CodecCost{})
		lay.Tied = bytes/s.Bandwidth + s.RTT/2 + msg
		sent[0] += bytes
		sent[stages-1] += bytes
		cpu[0] += msg
		cpu[stages-1] += msg
	}
	lay.PeerBytes = slices.Max(sent)
	lay.CommCPU = slices.Max(cpu)
	lay.Step = lay.Compute + lay.Update + lay.AllReduce + lay.Tied
	return lay, nil
}

// Plan projects pure data parallelism with each gradient codec and every
// feasible hybrid layout (S from 2 up, dividing Peers, or any S up to
// Peers with Idle) with each pair of gradient and activation codecs,
// fastest first: by step time, or with PerPeerBatch by time per sample.
func (s Setup) Plan(grads, acts []CodecCost) ([]Layout, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if len(grads) == 0 || len(acts) == 0 {
		return nil, fmt.Errorf("pipeline: planning with %d gradient and %d activation codecs", len(grads), len(acts))
	}
	var out []Layout
	for S := 1; S <= min(s.Peers, len(s.Layers)); S++ {
		R := s.Peers / S
		if (!s.Idle && s.Peers%S != 0) || S > 1 && s.batchFor(R*S) < R*s.Micro {
			continue
		}
		for gi, g := range grads {
			if gi > 0 && R == 1 {
				break // no ring: the gradient codec does not matter
			}
			for ai, a := range acts {
				if S == 1 && ai > 0 {
					break
				}
				l, err := s.Project(S, g, a)
				if err != nil {
					return nil, err
				}
				out = append(out, l)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Layout) int { return cmp.Compare(a.Step/float64(a.Batch), b.Step/float64(b.Batch)) })
	return out, nil
}
