package pipeline

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestBalanceKnownOptima checks cuts whose optimum is known by hand.
func TestBalanceKnownOptima(t *testing.T) {
	for _, tc := range []struct {
		costs  []float64
		stages int
		want   Split
		opt    float64
	}{
		{[]float64{1, 2, 3, 4, 5}, 1, Split{0, 5}, 15},
		{[]float64{1, 2, 3, 4, 5}, 2, Split{0, 3, 5}, 9},    // 6 | 9
		{[]float64{1, 2, 3, 4, 5}, 3, Split{0, 3, 4, 5}, 6}, // 6 | 4 | 5
		{[]float64{1, 2, 3, 4, 5}, 5, Split{0, 1, 2, 3, 4, 5}, 5},
		{[]float64{5, 1, 1, 1, 1, 1}, 2, Split{0, 1, 6}, 5}, // the big layer alone
		{[]float64{1, 1, 1, 1, 1, 1, 1, 1}, 4, Split{0, 2, 4, 6, 8}, 2},
		{[]float64{2, 2, 2, 2}, 3, Split{0, 1, 2, 4}, 4}, // ties: the earliest cuts
		{[]float64{0, 0, 0}, 2, Split{0, 1, 3}, 0},
		// a gpt's shape: a cheap embedding, equal blocks, a cheap norm and a costly head
		{[]float64{0.5, 4, 4, 4, 4, 0.1, 6}, 2, Split{0, 4, 7}, 12.5}, // 12.5 | 10.1
		{[]float64{0.5, 4, 4, 4, 4, 0.1, 6}, 3, Split{0, 3, 5, 7}, 8.5},
	} {
		got, opt, err := Balance(tc.costs, tc.stages)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.want) || math.Abs(opt-tc.opt) > 1e-12 {
			t.Errorf("Balance(%v, %d) = %v, %v; want %v, %v", tc.costs, tc.stages, got, opt, tc.want, tc.opt)
		}
		if m := slices.Max(got.Costs(tc.costs)); m != opt {
			t.Errorf("Balance(%v, %d): costliest stage %v, optimum reported %v", tc.costs, tc.stages, m, opt)
		}
	}
}

// enumerate calls f with every cut of n layers into k non-empty stages, in
// lexicographic order.
func enumerate(n, k int, f func(Split)) {
	sp := make(Split, k+1)
	sp[k] = n
	var rec func(s, from int)
	rec = func(s, from int) {
		if s == k {
			f(slices.Clone(sp))
			return
		}
		for c := from; c <= n-(k-s); c++ {
			sp[s] = c
			rec(s+1, c+1)
		}
	}
	sp[0] = 0
	rec(1, 1)
}

// TestBalanceMatchesBruteForce checks Balance against every cut of random
// small layer lists: the same optimum, and the lexicographically first cut
// that reaches it.
func TestBalanceMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 1))
	for trial := range 400 {
		n := 1 + rng.IntN(9)
		k := 1 + rng.IntN(n)
		costs := make([]float64, n)
		for i := range costs {
			if trial%3 == 0 {
				costs[i] = float64(rng.IntN(4)) // small integers: many ties
			} else {
				costs[i] = rng.ExpFloat64()
			}
		}
		got, opt, err := Balance(costs, k)
		if err != nil {
			t.Fatal(err)
		}
		var first Split
		bestV := math.Inf(1)
		enumerate(n, k, func(sp Split) {
			if v := slices.Max(sp.Costs(costs)); v < bestV-1e-12 {
				bestV, first = v, sp
			}
		})
		if math.Abs(opt-bestV) > 1e-12 || !slices.Equal(got, first) {
			t.Fatalf("Balance(%v, %d) = %v (%v), brute force %v (%v)", costs, k, got, opt, first, bestV)
		}
		if err := got.Check(n); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBalanceErrors checks that impossible cuts and bad costs are errors.
func TestBalanceErrors(t *testing.T) {
	for _, tc := range []struct {
		costs  []float64
		stages int
		want   string
	}{
		{[]float64{1, 2}, 3, "3 non-empty stages"},
		{[]float64{1, 2}, 0, "0 non-empty"},
		{nil, 1, "0 layers"},
		{[]float64{1, -1}, 1, "layer 1 costs -1"},
		{[]float64{math.NaN()}, 1, "NaN"},
		{[]float64{math.Inf(1)}, 1, "+Inf"},
	} {
		if _, _, err := Balance(tc.costs, tc.stages); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Balance(%v, %d): %v, want %q", tc.costs, tc.stages, err, tc.want)
		}
	}
	for _, sp := range []Split{{0}, {1, 3}, {0, 2, 2, 3}, {0, 2}} {
		if err := sp.Check(3); err == nil {
			t.Errorf("split %v of 3 layers: no error", sp)
		}
	}
}
