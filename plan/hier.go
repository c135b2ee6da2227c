// Latency-aware planning: the hierarchical schedule's groups from measured
// round-trip times, and the α–β predictions that choose it over the ring.

package plan

import (
	"math"
	"slices"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/gossip"
)

// HierarchicalGain is how much faster the α–β model must predict the
// hierarchical schedule than the flat ring before ChooseHierarchical
// prefers it.
const HierarchicalGain = 1.25

// maxScheduleName is the longest schedule name an epoch may carry (gossip
// refuses longer ones); groupings whose name is longer are not proposed.
const maxScheduleName = 32

// HierChoice is the outcome of ChooseHierarchical.
type HierChoice struct {
	// Schedule is the hierarchical schedule of Groups when it is predicted
	// at least HierarchicalGain faster than the flat ring, else
	// allreduce.ScheduleRing.
	Schedule allreduce.Schedule
	// Order is the ring order of the chosen schedule, as indices into the
	// matrices: RingOrder's for the ring; for the hierarchical schedule the
	// groups' members consecutively.
	Order []int
	// HierOrder and Groups are the best hierarchical layout found (also
	// when the ring is chosen): its ring order and its group sizes in it.
	HierOrder []int
	Groups    []int
	// RingSeconds and HierSeconds are the predicted times of the flat ring
	// in RingOrder and of the hierarchical layout.
	RingSeconds, HierSeconds float64
}

// ModelOf returns the α–β model of the ring order o over the link rates bw
// (bytes/s) and round-trip times rtt (seconds): the link from rank a to rank
// b has α = rtt/2 and β = bw between peers o[a] and o[b]. An unknown rate
// counts as 1 byte/s, an unknown RTT as 0.
func ModelOf(bw, rtt Matrix, o []int, chunkBytes int) allreduce.Model {
	return allreduce.Model{ChunkBytes: chunkBytes, Link: func(a, b int) allreduce.Link {
		i, j := o[a], o[b]
		return allreduce.Link{Alpha: rtt.at(i, j) / 2, Beta: math.Max(bw.at(i, j), 1)}
	}}
}

// ChooseHierarchical lays out a hierarchical all-reduce of a bucket of
// bytes (fp32, pipeline chunks of chunkBytes) from the measured link rates
// bw and round-trip times rtt, and compares it with the flat ring in
// RingOrder(bw) under the α–β model (allreduce.Model).
//
// Peers close to each other share a group: the candidates are the
// clusters of peers joined by round trips up to each measured level
// (single linkage, so racks become groups) and unions of consecutive
// clusters into G groups, and balanced cuts into G groups of the
// nearest-neighbour chain through the RTTs (with uniform RTTs the best is
// near G ≈ √W), for G from 2 to W/2. The candidate predicted fastest wins.
// Fewer than 4 peers always get the ring. Deterministic; O(W²) per
// candidate.
func ChooseHierarchical(bw, rtt Matrix, bytes, chunkBytes int) HierChoice {
	return chooseHierarchical(bw, rtt, RingOrder(bw), bytes, chunkBytes)
}

// chooseHierarchical is ChooseHierarchical with the flat ring's order
// (RingOrder(bw)) already known.
func chooseHierarchical(bw, rtt Matrix, flat []int, bytes, chunkBytes int) HierChoice {
	w := len(bw)
	c := HierChoice{Schedule: allreduce.ScheduleRing, Order: flat}
	if w < 2 {
		return c
	}
	c.RingSeconds = ModelOf(bw, rtt, flat, chunkBytes).Ring(w, bytes)
	if w < 4 {
		return c
	}
	consider := func(order, groups []int) {
		if len(allreduce.HierarchicalSchedule(groups)) > maxScheduleName {
			return
		}
		t := ModelOf(bw, rtt, order, chunkBytes).Hierarchical(groups, bytes)
		if c.Groups == nil || t < c.HierSeconds {
			c.HierOrder, c.Groups, c.HierSeconds = order, groups, t
		}
	}
	chain := rttChain(rtt)
	for _, g := range groupCounts(w) {
		consider(chain, allreduce.BalancedGroups(w, g))
	}
	for _, tau := range rttLevels(rtt) {
		order, clusters := rttClusters(rtt, chain, tau)
		if len(clusters) < 2 {
			continue
		}
		if len(clusters) <= w/2 {
			consider(order, clusters)
		}
		for _, g := range groupCounts(w) {
			if g < len(clusters) {
				consider(order, mergeClusters(clusters, g))
			}
		}
	}
	if c.Groups != nil && c.HierSeconds*HierarchicalGain < c.RingSeconds {
		c.Schedule, c.Order = allreduce.HierarchicalSchedule(c.Groups), c.HierOrder
	}
	return c
}

// groupCounts are the group counts ChooseHierarchical tries for w peers:
// 2 … w/2 growing by about a fifth (the predicted time changes slowly with
// the count), and DefaultGroups' count.
func groupCounts(w int) []int {
	out := []int{len(allreduce.DefaultGroups(w))}
	for g := 2; g <= w/2; g = max(g+1, g*6/5) {
		out = append(out, g)
	}
	return out
}

// mergeClusters joins consecutive clusters of the given sizes into k
// groups, cutting only between clusters, each cut where the running total
// comes closest to an equal split.
func mergeClusters(clusters []int, k int) []int {
	total := 0
	for _, c := range clusters {
		total += c
	}
	var groups []int
	cur, done := 0, 0
	for i, c := range clusters {
		cur += c
		target := float64(total) * float64(len(groups)+1) / float64(k)
		last := i == len(clusters)-1
		nextGap := math.Inf(1)
		if !last {
			nextGap = math.Abs(float64(done+cur+clusters[i+1]) - target)
		}
		if last || (len(groups) < k-1 && math.Abs(float64(done+cur)-target) <= nextGap) {
			groups = append(groups, cur)
			done += cur
			cur = 0
		}
	}
	return groups
}

// rttChain is the nearest-neighbour chain through the peers by RTT from
// peer 0 (ties to the lower index): close peers end up consecutive.
func rttChain(rtt Matrix) []int {
	n := len(rtt)
	used := make([]bool, n)
	o := make([]int, 0, n)
	for cur := 0; len(o) < n; {
		o = append(o, cur)
		used[cur] = true
		best := -1
		for j := 0; j < n; j++ {
			if !used[j] && (best < 0 || rtt.at(cur, j) < rtt.at(cur, best)) {
				best = j
			}
		}
		cur = best
	}
	return o
}

// rttLevels returns the distinct round trips of the matrix, quantised to
// powers of planStep (measurement noise below that is ignored), ascending.
func rttLevels(rtt Matrix) []float64 {
	seen := make(map[int]bool)
	last := 0.0
	for i := range rtt {
		for j := range rtt {
			if v := rtt.at(i, j); v > 0 && v != last {
				seen[int(math.Round(math.Log(v)/math.Log(planStep)))] = true
				last = v
			}
		}
	}
	out := make([]float64, 0, len(seen))
	for k := range seen {
		out = append(out, math.Pow(planStep, float64(k)))
	}
	slices.Sort(out)
	return out
}

// rttClusters groups the peers joined by round trips of at most tau·√planStep
// (the quantisation's half step), transitively: the groups appear in the
// order of their first member in chain, their members in chain order.
func rttClusters(rtt Matrix, chain []int, tau float64) (order, groups []int) {
	n := len(rtt)
	limit := tau * math.Sqrt(planStep)
	comp := make([]int, n)
	for i := range comp {
		comp[i] = -1
	}
	var members [][]int
	for _, s := range chain {
		if comp[s] >= 0 {
			continue
		}
		id := len(members)
		comp[s] = id
		stack := []int{s}
		for len(stack) > 0 {
			i := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for j := 0; j < n; j++ {
				if comp[j] < 0 && j != i && rtt.at(i, j) > 0 && rtt.at(i, j) <= limit {
					comp[j] = id
					stack = append(stack, j)
				}
			}
		}
		members = append(members, nil)
	}
	for _, s := range chain {
		members[comp[s]] = append(members[comp[s]], s)
	}
	for _, m := range members {
		order = append(order, m...)
		groups = append(groups, len(m))
	}
	return order, groups
}

// RTTMatrix builds the round-trip matrix in seconds of order from the
// figures each peer reports (rows[id]); a direction nobody measured takes
// the reverse figure. known counts the ordered pairs with a figure.
func RTTMatrix(order []string, rows map[string][]gossip.LinkFigure) (m Matrix, known int) {
	return figureMatrix(order, rows, func(l gossip.LinkFigure) float64 { return l.RTTMs / 1e3 })
}
