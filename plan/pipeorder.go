// Ring epoch orders for pipeline layouts: which member holds which stage
// of which pipeline, from the measured links.

package plan

import (
	"cmp"
	"math"
	"slices"
)

// pipeScore ranks a pipeline layout's links: the slowest hop between
// consecutive stages of a pipeline (activations and their gradients cross
// it every micro-batch, both ways), then the slowest edge of a stage's
// ring of replicas (its gradients, once a step), then the sum of the hops'
// rates. Each link counts at the slower of its two directions.
type pipeScore struct{ hop, ring, sum float64 }

// better reports whether a ranks above b.
func (a pipeScore) better(b pipeScore) bool {
	return cmp.Or(cmp.Compare(a.hop, b.hop), cmp.Compare(a.ring, b.ring), cmp.Compare(a.sum, b.sum)) > 0
}

// scorePipelines scores the layout pipeline.Assign makes of order o with
// stages stages: pipeline r is o[r·S … r·S+S−1], stage s's ring the
// members at positions s, s+S, …; the last len(o) mod S are idle.
func scorePipelines(m Matrix, o []int, stages int) pipeScore {
	rate := func(a, b int) float64 { return min(m.at(a, b), m.at(b, a)) }
	R := len(o) / stages
	first := true
	var sc pipeScore
	for r := range R {
		for s := range stages - 1 {
			v := rate(o[r*stages+s], o[r*stages+s+1])
			sc.sum += v
			if first || v < sc.hop {
				sc.hop = v
			}
			first = false
		}
	}
	if R < 2 {
		return sc
	}
	first = true
	for s := range stages {
		for r := range R {
			v := rate(o[r*stages+s], o[(r+1)%R*stages+s])
			if first || v < sc.ring {
				sc.ring = v
			}
			first = false
		}
	}
	return sc
}

// pipeSearchPasses bounds the local search of PipelineOrder: each pass
// tries every swap of two positions once, and only orders of up to
// pipeSearchMax members are searched (each swap rescores the layout:
// BenchmarkPipelineOrder).
const (
	pipeSearchPasses = 4
	pipeSearchMax    = 64
)

// linkPipelineOrder returns an order of the len(m) members (indices into m)
// for pipelines of stages consecutive members (pipeline.Assign), so that
// the links between consecutive stages are fast: the rotation of
// RingOrder's ring whose pipelines' slowest hop is fastest (a ring
// maximises its slowest edge, and the R edges between pipelines, which
// carry no activations, should be its slowest), then swaps of two members
// while one ranks the layout higher (pipeScore: the slowest hop, then the
// slowest edge of the stages' rings, then the hops' sum), for at most
// pipeSearchPasses passes and up to pipeSearchMax members. It is
// deterministic. With fewer members than
// stages, or stages < 2, it returns RingOrder(m).
func linkPipelineOrder(m Matrix, stages int) []int {
	o := RingOrder(m)
	n := len(o)
	if stages < 2 || n < stages {
		return o
	}
	best, bestScore := o, scorePipelines(m, o, stages)
	rot := make([]int, n)
	for k := 1; k < n; k++ {
		for i := range n {
			rot[i] = o[(i+k)%n]
		}
		if sc := scorePipelines(m, rot, stages); sc.better(bestScore) {
			best, bestScore = append([]int(nil), rot...), sc
		}
	}
	for pass := 0; pass < pipeSearchPasses && n <= pipeSearchMax; pass++ {
		improved := false
		for i := range n {
			for j := i + 1; j < n; j++ {
				best[i], best[j] = best[j], best[i]
				if sc := scorePipelines(m, best, stages); sc.better(bestScore) {
					bestScore, improved = sc, true
					continue
				}
				best[i], best[j] = best[j], best[i]
			}
		}
		if !improved {
			break
		}
	}
	return best
}

// SlowCompute is how much slower than the training members' slowest a
// member's compute must be for a pipeline layout that leaves members idle
// to leave it idle whatever its links (SlowMembers).
const SlowCompute = 1.25

// SlowMembers returns the members (indices into compute, ascending) that a
// layout of stages stages leaves idle for their compute: of the len(compute)
// mod stages members it leaves idle, those whose compute (seconds per
// sample; 0: not measured, taken as the median of those measured) exceeds
// SlowCompute times that of the slowest member a layout must train with
// (the len(compute) − len(compute) mod stages-th fastest). Every pipeline
// waits for its slowest stage and every stage's ring for its slowest
// replica, so one slow device slows the whole step; idle, it costs
// nothing. Nil with stages < 2, no idle place or no measurement.
func SlowMembers(compute []float64, stages int) []int {
	n := len(compute)
	if stages < 2 || n < stages || n%stages == 0 {
		return nil
	}
	c := filledCompute(compute)
	if c == nil {
		return nil
	}
	byCompute := make([]int, n)
	for i := range byCompute {
		byCompute[i] = i
	}
	slices.SortStableFunc(byCompute, func(a, b int) int { return cmp.Compare(c[a], c[b]) })
	train := n - n%stages
	var slow []int
	for _, i := range byCompute[train:] {
		if c[i] > SlowCompute*c[byCompute[train-1]] {
			slow = append(slow, i)
		}
	}
	slices.Sort(slow)
	return slow
}

// filledCompute returns compute with unmeasured figures (0, or not a
// finite positive number) replaced by the median of the measured ones,
// or nil when none is measured.
func filledCompute(compute []float64) []float64 {
	var known []float64
	for _, v := range compute {
		if v > 0 && !math.IsInf(v, 0) {
			known = append(known, v)
		}
	}
	if len(known) == 0 {
		return nil
	}
	slices.Sort(known)
	med := known[len(known)/2]
	c := make([]float64, len(compute))
	for i, v := range compute {
		c[i] = v
		if !(v > 0) || math.IsInf(v, 0) {
			c[i] = med
		}
	}
	return c
}

// TrainingCompute returns the slowest compute (seconds per sample) among
// the members a layout of stages stages trains with when SlowMembers are
// idle: what bounds its step. 0 when nothing is measured.
func TrainingCompute(compute []float64, stages int) float64 {
	c := filledCompute(compute)
	slow := SlowMembers(compute, stages)
	var worst float64
	for i, v := range c {
		if !slices.Contains(slow, i) {
			worst = max(worst, v)
		}
	}
	return worst
}

// PipelineOrder returns an order of the len(m) members (indices into m)
// for pipelines of stages consecutive members (pipeline.Assign): the
// members SlowMembers leaves idle for their compute (nil compute: none)
// take the last, idle places, and the others are laid out on their links
// (linkPipelineOrder). It is deterministic.
func PipelineOrder(m Matrix, stages int, compute []float64) []int {
	slow := SlowMembers(compute, stages)
	if len(slow) == 0 {
		return linkPipelineOrder(m, stages)
	}
	rest := make([]int, 0, len(m)-len(slow))
	for i := range m {
		if !slices.Contains(slow, i) {
			rest = append(rest, i)
		}
	}
	sub := make(Matrix, len(rest))
	for a, i := range rest {
		sub[a] = make([]float64, len(rest))
		for b, j := range rest {
			sub[a][b] = m.at(i, j)
		}
	}
	out := make([]int, 0, len(m))
	for _, a := range linkPipelineOrder(sub, stages) {
		out = append(out, rest[a])
	}
	return append(out, slow...)
}

// replanPipelines reports whether the pipeline layout of order next is
// worth a new epoch over that of cur (both orders of ids, whose links m
// holds): its slowest hop replanGain times faster, or as fast with its
// stages' rings' slowest edge replanGain times faster. Every change of
// layout moves members to other stages, whose states they fetch.
func replanPipelines(m Matrix, ids, cur, next []string, stages int) bool {
	index := func(order []string) []int {
		o := make([]int, len(order))
		for k, id := range order {
			if o[k] = slices.Index(ids, id); o[k] < 0 {
				return nil
			}
		}
		return o
	}
	a, b := index(cur), index(next)
	if a == nil || b == nil || len(a) != len(b) || len(a) < stages {
		return false
	}
	was, now := scorePipelines(m, a, stages), scorePipelines(m, b, stages)
	return now.hop > replanGain*was.hop || (now.hop >= was.hop && now.ring > replanGain*was.ring)
}

// idlesSlowMembers reports whether the pipeline layout of order next
// leaves idle a member that SlowMembers would (compute is indexed like
// ids) and that the layout of cur trains with: a slow device then stops
// holding back every step.
func idlesSlowMembers(cur, next []string, compute []float64, ids []string, stages int) bool {
	slow := SlowMembers(compute, stages)
	trains := func(order []string, id string) bool {
		k := slices.Index(order, id)
		return k >= 0 && k < len(order)-len(order)%stages
	}
	for _, i := range slow {
		if trains(cur, ids[i]) && !trains(next, ids[i]) {
			return true
		}
	}
	return false
}

// LayoutRates returns the rate of each hop between consecutive stages
// (hops[h] between stages h and h+1: the slowest of the R pipelines' links
// there, as every pipeline waits for the slowest at the step's end) and
// the slowest edge of the stages' rings, each link at the slower of its
// directions, of the layout pipeline.Assign makes of order o with stages
// stages, over the measured rates m: 0 where none of them is measured.
func LayoutRates(m Matrix, o []int, stages int) (hops []float64, ring float64) {
	rate := func(a, b int) float64 {
		x, y := m.at(a, b), m.at(b, a)
		switch {
		case x > 0 && y > 0:
			return min(x, y)
		case math.IsInf(x, 0) || math.IsInf(y, 0):
			return 0
		}
		return max(x, y)
	}
	slowest := func(cur, v float64) float64 {
		if v > 0 && (cur == 0 || v < cur) {
			return v
		}
		return cur
	}
	R := len(o) / max(stages, 1)
	hops = make([]float64, max(stages-1, 0))
	for r := range R {
		for s := range stages - 1 {
			hops[s] = slowest(hops[s], rate(o[r*stages+s], o[r*stages+s+1]))
		}
	}
	for s := range stages {
		for r := range R {
			if R > 1 {
				ring = slowest(ring, rate(o[r*stages+s], o[(r+1)%R*stages+s]))
			}
		}
	}
	return hops, ring
}
