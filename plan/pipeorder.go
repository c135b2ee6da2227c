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

// PipelineOrder returns an order of the len(m) members (indices into m)
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
func PipelineOrder(m Matrix, stages int) []int {
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

// LayoutRates returns the slowest hop between consecutive stages and the
// slowest edge of the stages' rings (each link at the slower of its
// directions) of the layout pipeline.Assign makes of order o with stages
// stages, over the measured rates m: 0 where none of them is measured.
func LayoutRates(m Matrix, o []int, stages int) (hop, ring float64) {
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
	for r := range R {
		for s := range stages - 1 {
			hop = slowest(hop, rate(o[r*stages+s], o[r*stages+s+1]))
		}
	}
	for s := range stages {
		for r := range R {
			if R > 1 {
				ring = slowest(ring, rate(o[r*stages+s], o[(r+1)%R*stages+s]))
			}
		}
	}
	return hop, ring
}
