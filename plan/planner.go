// Package plan lays out ring epochs from measured links: the ring order that
// maximises the slowest edge, bandwidth-proportional shares, per-link codec
// choice, and the EpochSpec every member derives from an adopted epoch. It is
// pure: no IO, no clock, no goroutines.
package plan

import (
	"fmt"
	"math"
	"slices"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/gossip"
)

// replanGain is how much faster (predicted) a new layout of unchanged members
// must be before the coordinator proposes it.
const replanGain = 1.25

// planStep quantises bandwidths for planning to powers of this factor: the
// plan ignores measurement noise below it, and the ring search stays fast
// (few distinct edge values).
const planStep = 1.25

// LinkRows indexes the members' gossiped link figures by peer ID.
func LinkRows(members []gossip.Member) map[string][]gossip.LinkFigure {
	rows := make(map[string][]gossip.LinkFigure, len(members))
	for _, m := range members {
		rows[m.PeerID] = m.Links
	}
	return rows
}

// LinkMatrix builds the bytes/s matrix of order from the figures each peer
// reports (rows[id]); a direction nobody measured takes the reverse figure.
// known counts the ordered pairs with a figure.
func LinkMatrix(order []string, rows map[string][]gossip.LinkFigure) (m Matrix, known int) {
	return figureMatrix(order, rows, func(l gossip.LinkFigure) float64 { return l.MbitS * 1e6 / 8 })
}

// figureMatrix builds the matrix of order of one figure of each peer's
// reported links (value; not positive and finite means unknown); a
// direction nobody measured takes the reverse figure. known counts the
// ordered pairs with a figure.
func figureMatrix(order []string, rows map[string][]gossip.LinkFigure, value func(gossip.LinkFigure) float64) (m Matrix, known int) {
	idx := make(map[string]int, len(order))
	for i, id := range order {
		idx[id] = i
	}
	m = make(Matrix, len(order))
	for i := range m {
		m[i] = make([]float64, len(order))
	}
	for i, id := range order {
		for _, l := range rows[id] {
			v := value(l)
			if j, ok := idx[l.Peer]; ok && j != i && v > 0 && !math.IsInf(v, 0) {
				m[i][j] = v
			}
		}
	}
	for i := range m {
		for j := range m {
			if i != j && m[i][j] == 0 && m[j][i] > 0 {
				m[i][j] = m[j][i]
			}
			if i != j && m[i][j] > 0 {
				known++
			}
		}
	}
	return m, known
}

// planMatrix is LinkMatrix prepared for planning (Planning). complete
// reports whether every pair was measured.
func planMatrix(order []string, members []gossip.Member) (m Matrix, complete, any bool) {
	m, known := LinkMatrix(order, LinkRows(members))
	return Planning(m), known == len(order)*(len(order)-1), known > 0
}

// Planning returns a matrix of measured rates prepared for planning (m is
// left as it is): unknown pairs take the median known figure (all equal
// when nothing is known, which gives the peer-ID order) and every figure
// is quantised to a power of planStep.
func Planning(measured Matrix) Matrix {
	m := make(Matrix, len(measured))
	for i := range measured {
		m[i] = slices.Clone(measured[i])
	}
	var vals []float64
	for i := range m {
		for j := range m {
			if i != j && m[i][j] > 0 {
				vals = append(vals, m[i][j])
			}
		}
	}
	fill := 1.0
	if len(vals) > 0 {
		slices.Sort(vals)
		fill = vals[len(vals)/2]
	}
	for i := range m {
		for j := range m {
			if i == j {
				continue
			}
			if !(m[i][j] > 0) || math.IsInf(m[i][j], 0) {
				m[i][j] = fill
			}
			m[i][j] = math.Pow(planStep, math.Round(math.Log(m[i][j])/math.Log(planStep)))
		}
	}
	return m
}

// Planner is the gossip.Planner of this peer's proposals: the ring order
// that maximises the slowest measured edge and, when allreduce.schedule is
// auto, the bandwidth-proportional schedule where it is predicted faster.
type Planner struct {
	// schedule is allreduce.schedule ("auto" lets measurements choose).
	schedule    allreduce.Schedule
	bucketBytes int
	// codec is allreduce.codec in canonical form when it can use per-link
	// codecs and allreduce.link_codecs is not off; "" otherwise.
	codec string
	// override is allreduce.link_codecs when it names a codec.
	override string
	// stages returns the pipeline stages the cluster trains with (nil, or
	// below 2: pure data parallelism).
	stages func() int
}

var _ gossip.Planner = Planner{}

// WithStages returns p planning for pipelines of stages() stages whenever
// it returns 2 or more (train.pipeline_stages, or the choice of "auto"):
// the epoch's order is then PipelineOrder's, which lays the pipelines
// (pipeline.Assign) on the fastest links, and the whole ring's schedule,
// which a pipeline does not run, stays the configured one.
func (p Planner) WithStages(stages func() int) Planner {
	p.stages = stages
	return p
}

// Values of Settings.LinkCodecs besides a codec spec.
const (
	LinkCodecsAuto = "auto"
	LinkCodecsOff  = "off"
)

// Settings are the [allreduce] keys a Planner follows.
type Settings struct {
	// Schedule is allreduce.schedule ("auto" lets measurements choose).
	Schedule string
	// BucketBytes is the fusion bucket size the predictions are made for.
	BucketBytes int
	// Codec is allreduce.codec.
	Codec string
	// LinkCodecs is allreduce.link_codecs: LinkCodecsAuto, LinkCodecsOff or
	// a codec spec used on slow links instead of the automatic choice.
	LinkCodecs string
}

// NewPlanner returns the planner of settings s, which must have been
// validated (ValidateLinkCodecs and allreduce.ParseSchedule).
func NewPlanner(s Settings) Planner {
	sch, _ := allreduce.ParseSchedule(s.Schedule)
	p := Planner{schedule: sch, bucketBytes: s.BucketBytes}
	if s.LinkCodecs != LinkCodecsAuto && s.LinkCodecs != LinkCodecsOff {
		p.override = s.LinkCodecs
	}
	if s.LinkCodecs != LinkCodecsOff {
		p.codec, _ = allreduce.CanonicalLinkCodec(s.Codec) // "" for codecs without per-link variants
	}
	return p
}

// ValidateLinkCodecs checks allreduce.link_codecs (linkCodecs) against
// allreduce.codec (codec): auto, off, or a per-link codec spec, which also
// needs a per-link codec.
func ValidateLinkCodecs(linkCodecs, codec string) error {
	switch linkCodecs {
	case LinkCodecsAuto, LinkCodecsOff:
		return nil
	case "":
		return fmt.Errorf(`empty; want "auto", "off" or a codec spec`)
	}
	if _, err := allreduce.CanonicalLinkCodec(linkCodecs); err != nil {
		return fmt.Errorf("%q: %w", linkCodecs, err)
	}
	if _, err := allreduce.CanonicalLinkCodec(codec); err != nil {
		return fmt.Errorf("%q needs a linear or quantized allreduce.codec: %w", linkCodecs, err)
	}
	return nil
}

// scheduleName is the epoch's name of a schedule ("auto" for ScheduleAuto).
func scheduleName(s allreduce.Schedule) string {
	if s == allreduce.ScheduleAuto {
		return "auto"
	}
	return string(s)
}

// Plan lays out an epoch of live: Choose over the measured links,
// with per-link codecs on the ring where the codec has them; with schedule
// auto, the ring with per-link codecs replaces proportional shares when it
// is predicted faster (ChooseLinks).
func (p Planner) Plan(live []string, members []gossip.Member) gossip.EpochPlan {
	out := gossip.EpochPlan{Order: live, Schedule: scheduleName(p.schedule)}
	m, _, any := planMatrix(live, members)
	if len(live) < 2 {
		return out
	}
	if p.stages != nil {
		if s := p.stages(); s >= 2 {
			// Members far slower than the others are left idle even before
			// any link is measured.
			compute := MemberCompute(live, members)
			if !any && SlowMembers(compute, s) == nil {
				return out
			}
			out.Order = make([]string, len(live))
			for k, i := range PipelineOrder(m, s, compute) {
				out.Order[k] = live[i]
			}
			return out
		}
	}
	if !any {
		return out
	}
	plan := Choose(m, p.bucketBytes)
	var edges []string
	var final string
	switch {
	case p.codec == "":
	case p.schedule == allreduce.ScheduleAuto:
		// err is impossible: both specs were validated.
		plan, edges, final, _ = ChooseLinks(m, p.bucketBytes, p.codec, p.override)
	case p.schedule == allreduce.ScheduleRing:
		edges, final = p.linkCodecs(m, plan.Order)
	}
	out.Order = make([]string, len(plan.Order))
	for k, i := range plan.Order {
		out.Order[k] = live[i]
	}
	switch {
	case p.schedule == allreduce.ScheduleAuto && plan.Schedule == allreduce.ScheduleProportional:
		out.Schedule, out.Shares = string(allreduce.ScheduleProportional), plan.Shares
	case p.schedule == allreduce.ScheduleProportional:
		out.Shares = Shares(orderedRates(m, plan.Order))
	}
	out.LinkCodecs, out.FinalCodec = edges, final
	return p.latencyAware(live, members, m, out)
}

// latencyAware returns the hierarchical layout of ChooseHierarchical in
// place of plan when allreduce.schedule is hier, or when it is auto and
// the α–β model with the measured round trips predicts the hierarchy at
// least HierarchicalGain faster than plan; else plan. m is planMatrix of
// live.
func (p Planner) latencyAware(live []string, members []gossip.Member, m Matrix, plan gossip.EpochPlan) gossip.EpochPlan {
	if !p.schedule.Hierarchical() && p.schedule != allreduce.ScheduleAuto {
		return plan
	}
	rtt, ok := planRTT(live, members)
	if !ok {
		return plan
	}
	o := make([]int, len(plan.Order)) // Choose's ring order, which ChooseHierarchical would compute again
	for k, id := range plan.Order {
		o[k] = slices.Index(live, id)
	}
	c := chooseHierarchical(m, rtt, o, p.bucketBytes, 0)
	if c.Groups == nil {
		return plan
	}
	if p.schedule == allreduce.ScheduleAuto && c.HierSeconds*HierarchicalGain >= p.predictSeconds(m, rtt, live, plan) {
		return plan
	}
	out := gossip.EpochPlan{Schedule: string(allreduce.HierarchicalSchedule(c.Groups))}
	for _, i := range c.HierOrder {
		out.Order = append(out.Order, live[i])
	}
	return out
}

// planRTT is RTTMatrix of order for planning: pairs nobody measured take
// the median measured round trip. ok is false when none was measured.
func planRTT(order []string, members []gossip.Member) (m Matrix, ok bool) {
	m, known := RTTMatrix(order, LinkRows(members))
	if known == 0 {
		return m, false
	}
	var vals []float64
	for i := range m {
		for j := range m {
			if i != j && m[i][j] > 0 {
				vals = append(vals, m[i][j])
			}
		}
	}
	slices.Sort(vals)
	for i := range m {
		for j := range m {
			if i != j && m[i][j] == 0 {
				m[i][j] = vals[len(vals)/2]
			}
		}
	}
	return m, true
}

// linkCodecs returns the per-link codecs of ring order o over m, or nil
// when every link would use the configured codec.
func (p Planner) linkCodecs(m Matrix, o []int) ([]string, string) {
	edges, final, err := EdgeCodecs(p.codec, m, o, p.override)
	if err != nil || final != p.codec {
		return edges, final // err is impossible: both specs were validated
	}
	for _, e := range edges {
		if e != p.codec {
			return edges, final
		}
	}
	return nil, ""
}

// MemberCompute returns each member's compute of order (seconds per
// sample, gossip.Heartbeat.ComputeUS; 0 where unknown), or nil when no
// member announced one.
func MemberCompute(order []string, members []gossip.Member) []float64 {
	byID := make(map[string]float64, len(members))
	for _, m := range members {
		byID[m.PeerID] = m.ComputeUS * 1e-6
	}
	var c []float64
	for i, id := range order {
		if v := byID[id]; v > 0 {
			if c == nil {
				c = make([]float64, len(order))
			}
			c[i] = v
		}
	}
	return c
}

// Replan reports whether plan is predicted at least replanGain faster than
// cur, judged only once every pair of cur's members has been measured, or,
// for pipelines, whether plan idles a slow member that cur trains with
// (plan.SlowMembers).
func (p Planner) Replan(cur gossip.Epoch, plan gossip.EpochPlan, members []gossip.Member) bool {
	ids := slices.Clone(cur.Order)
	slices.Sort(ids)
	m, complete, _ := planMatrix(ids, members)
	if p.stages != nil {
		if s := p.stages(); s >= 2 {
			if idlesSlowMembers(cur.Order, plan.Order, MemberCompute(ids, members), ids, s) {
				return true // whatever is known of the links
			}
			return complete && replanPipelines(m, ids, cur.Order, plan.Order, s)
		}
	}
	if !complete {
		return false
	}
	rtt, _ := planRTT(ids, members)
	before := p.predictSeconds(m, rtt, ids, cur.Plan())
	after := p.predictSeconds(m, rtt, ids, plan)
	return after > 0 && before > replanGain*after
}

// predictSeconds predicts a bucket's all-reduce time for the layout plan
// (peer IDs; m and rtt, the round trips in seconds or all 0 when unknown,
// are indexed like ids): the α–β model for the hierarchical schedule, and
// for the others their bandwidth time plus the latency of their steps
// (latencySeconds).
func (p Planner) predictSeconds(m, rtt Matrix, ids []string, plan gossip.EpochPlan) float64 {
	o := make([]int, len(plan.Order))
	for k, id := range plan.Order {
		o[k] = slices.Index(ids, id)
		if o[k] < 0 {
			return 0
		}
	}
	if sch := allreduce.Schedule(plan.Schedule); sch.Hierarchical() {
		g, err := sch.Groups(len(o))
		if err != nil {
			return 0
		}
		return ModelOf(m, rtt, o, 0).Hierarchical(g, p.bucketBytes)
	}
	return p.bandwidthSeconds(m, o, plan) + latencySeconds(rtt, o, plan.Schedule)
}

// latencySeconds is the latency the bandwidth predictions of the ring and
// the direct schedules leave out: the α–β model's chain of one-way
// latencies around the ring in order o for the ring, two of the largest for
// the two phases of the direct and proportional schedules (0 when rtt
// holds no figures).
func latencySeconds(rtt Matrix, o []int, schedule string) float64 {
	switch allreduce.Schedule(schedule) {
	case allreduce.ScheduleDirect, allreduce.ScheduleProportional:
		most := 0.0
		for _, i := range o {
			for _, j := range o {
				most = math.Max(most, rtt.at(i, j))
			}
		}
		return most // 2 × α, α = RTT/2
	}
	md := allreduce.Model{Link: func(a, b int) allreduce.Link {
		return allreduce.Link{Alpha: rtt.at(o[a], o[b]) / 2, Beta: math.Inf(1)}
	}}
	return md.Ring(len(o), 4*len(o))
}

// bandwidthSeconds predicts the bandwidth-limited time of a bucket for the
// ring or direct layout plan in order o.
func (p Planner) bandwidthSeconds(m Matrix, o []int, plan gossip.EpochPlan) float64 {
	bytes, schedule, shares := p.bucketBytes, plan.Schedule, plan.Shares
	if len(plan.LinkCodecs) == len(o) && p.codec != "" {
		if t, ok := p.linkSeconds(m, o, plan); ok {
			return t
		}
	}
	if schedule == string(allreduce.ScheduleProportional) {
		rates := orderedRates(m, o)
		if len(shares) != len(o) {
			shares = make([]float64, len(o))
			for i := range shares {
				shares[i] = 1 / float64(len(o))
			}
		}
		return ProportionalSeconds(rates, shares, float64(bytes))
	}
	return RingSeconds(m, o, float64(bytes))
}

// linkSeconds predicts the ring time of plan's per-link codecs.
func (p Planner) linkSeconds(m Matrix, o []int, plan gossip.EpochPlan) (float64, bool) {
	t, err := LinkPlanSeconds(m, o, float64(p.bucketBytes), p.codec, plan.LinkCodecs, plan.FinalCodec)
	return t, err == nil
}

// orderedRates returns the peers' interface rates in ring order o.
func orderedRates(m Matrix, o []int) []float64 {
	rates := PeerRates(m)
	out := make([]float64, len(o))
	for k, i := range o {
		out[k] = rates[i]
	}
	return out
}

// RingBandwidth is the slowest edge of the ring in order 0, 1, … of m, or 0
// if any edge is unknown.
func RingBandwidth(m Matrix) float64 {
	if len(m) < 2 {
		return 0
	}
	o := make([]int, len(m))
	for i := range o {
		o[i] = i
	}
	b := Bottleneck(m, o)
	if math.IsInf(b, 0) {
		return 0
	}
	return b
}
