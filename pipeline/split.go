package pipeline

import (
	"fmt"
	"math"
)

// Split is a cut of a layer list into contiguous stages: stage s holds
// layers [Split[s], Split[s+1]); Split[0] is 0 and the last element is the
// number of layers.
type Split []int

// Stages returns the number of stages.
func (sp Split) Stages() int { return len(sp) - 1 }

// Costs returns the sum of costs over each stage's layers.
func (sp Split) Costs(costs []float64) []float64 {
	out := make([]float64, sp.Stages())
	for s := range out {
		for _, c := range costs[sp[s]:sp[s+1]] {
			out[s] += c
		}
	}
	return out
}

// Check returns an error unless sp cuts n layers into non-empty stages.
func (sp Split) Check(n int) error {
	if len(sp) < 2 || sp[0] != 0 || sp[len(sp)-1] != n {
		return fmt.Errorf("pipeline: split %v does not cover %d layers from 0", []int(sp), n)
	}
	for s := 0; s+1 < len(sp); s++ {
		if sp[s] >= sp[s+1] {
			return fmt.Errorf("pipeline: split %v has an empty stage %d", []int(sp), s)
		}
	}
	return nil
}

// Balance cuts layers of the given costs (seconds, or any additive
// measure) into stages contiguous non-empty stages so that the costliest
// stage costs as little as possible: in a pipeline, the slowest stage sets
// the pace. It is exact: a dynamic programme over suffixes of the layer
// list, O(stages·n²) for n layers. Among the optimal cuts it returns the
// lexicographically smallest (every cut as early as the optimum allows).
// It also returns the optimum, the costliest stage's cost.
func Balance(costs []float64, stages int) (Split, float64, error) {
	n := len(costs)
	if stages < 1 || stages > n {
		return nil, 0, fmt.Errorf("pipeline: cannot cut %d layers into %d non-empty stages", n, stages)
	}
	for i, c := range costs {
		if !(c >= 0) || math.IsInf(c, 1) {
			return nil, 0, fmt.Errorf("pipeline: layer %d costs %v, want a finite value ≥ 0", i, c)
		}
	}
	// pre[i] is the cost of layers [0, i); a stage [i, j) costs pre[j]-pre[i],
	// computed the same way wherever it appears, so the comparisons below are
	// exact.
	pre := make([]float64, n+1)
	for i, c := range costs {
		pre[i+1] = pre[i] + c
	}
	cost := func(i, j int) float64 { return pre[j] - pre[i] }
	// best[k][i] is the least possible costliest stage when layers [i, n)
	// are cut into k stages (+Inf where fewer than k layers remain).
	best := make([][]float64, stages+1)
	for k := range best {
		best[k] = make([]float64, n+1)
		for i := range best[k] {
			best[k][i] = math.Inf(1)
		}
	}
	for i := 0; i < n; i++ {
		best[1][i] = cost(i, n)
	}
	for k := 2; k <= stages; k++ {
		for i := 0; i+k <= n; i++ {
			for j := i + 1; j+k-1 <= n; j++ {
				best[k][i] = min(best[k][i], max(cost(i, j), best[k-1][j]))
			}
		}
	}
	opt := best[stages][0]
	sp := Split{0}
	for k, i := stages, 0; k > 1; k-- {
		j := i + 1
		for max(cost(i, j), best[k-1][j]) > opt {
			j++
		}
		sp = append(sp, j)
		i = j
	}
	return append(sp, n), opt, nil
}
