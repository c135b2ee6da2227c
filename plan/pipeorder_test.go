package plan

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/p2ptrain/p2ptrain/gossip"
)

// racks returns an n×n Mbit/s table of two racks, the members of rackA
// and the others (rackMatrix).
func racks(n int, rackA []int) [][]float64 {
	rackOf := make([]int, n)
	for _, i := range rackA {
		rackOf[i] = 1
	}
	return rackMatrix(rackOf)
}

// hopRates returns the rates of the hops between consecutive stages of
// order o's pipelines of stages members.
func hopRates(m Matrix, o []int, stages int) []float64 {
	var out []float64
	for r := range len(o) / stages {
		for s := range stages - 1 {
			a, b := o[r*stages+s], o[r*stages+s+1]
			out = append(out, min(m[a][b], m[b][a]))
		}
	}
	return out
}

// rackMatrix returns the Mbit/s table of members in racks (rackOf[i] is
// member i's): 1000 Mbit/s within a rack, 100 between racks.
func rackMatrix(rackOf []int) [][]float64 {
	n := len(rackOf)
	m := fastRing(n, nil, 100, 100)
	for i := range n {
		for j := range n {
			if i != j && rackOf[i] == rackOf[j] {
				m[i][j] = 1000
			}
		}
	}
	return m
}

// TestPipelineOrderKeepsPipelinesInRacks: 9 members in three racks (of
// 3, 2 and 4) and 2 stages: the ring RingOrder finds, cut into pipelines
// from its start, puts a pipeline across two racks; PipelineOrder puts
// every hop on a fast link, and idles a member.
func TestPipelineOrderKeepsPipelinesInRacks(t *testing.T) {
	m := mbitMatrix(rackMatrix([]int{1, 0, 0, 1, 2, 2, 2, 2, 1}))
	fast := 1000 * 1e6 / 8
	slow := func(o []int) bool { return slices.Min(hopRates(m, o, 2)) < fast }
	if ring := RingOrder(m); !slow(ring) {
		t.Fatalf("the ring %v cut into pairs keeps every pipeline in a rack: the case does not test PipelineOrder", ring)
	}
	o := PipelineOrder(m, 2, nil)
	if sorted := slices.Sorted(slices.Values(o)); !slices.Equal(sorted, []int{0, 1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("order %v is not a permutation", o)
	}
	if slow(o) {
		t.Errorf("order %v puts a hop on a 100 Mbit/s link: %v", o, hopRates(m, o, 2))
	}
	if got := PipelineOrder(m, 1, nil); !slices.Equal(got, RingOrder(m)) {
		t.Errorf("one stage: %v, want RingOrder's %v", got, RingOrder(m))
	}
}

// slowLinks sets every link of member i in mbit to rate Mbit/s, both
// ways, and returns mbit.
func slowLinks(mbit [][]float64, i int, rate float64) [][]float64 {
	for j := range mbit {
		if j != i {
			mbit[i][j], mbit[j][i] = rate, rate
		}
	}
	return mbit
}

// TestPipelineOrderIdleMembers: with 5 members and 2 stages the member
// left idle is the one whose links are slow, and the rings of the stages
// break ties between layouts whose hops are equally fast.
func TestPipelineOrderIdleMembers(t *testing.T) {
	m := mbitMatrix(slowLinks(fastRing(5, nil, 1000, 1000), 2, 10))
	o := PipelineOrder(m, 2, nil)
	if o[4] != 2 {
		t.Errorf("order %v: member 2, on 10 Mbit/s links, should sit idle (last)", o)
	}
	// 4 members, 2 stages: the pairs (0,1) and (2,3) are the fast hops
	// either way; the rings of stage replicas are 0↔2 and 1↔3 or 0↔3 and
	// 1↔2, and only 0↔2 and 1↔3 are fast.
	mbit := fastRing(4, nil, 100, 100)
	for _, e := range [][2]int{{0, 1}, {2, 3}} {
		mbit[e[0]][e[1]], mbit[e[1]][e[0]] = 1000, 1000
	}
	for _, e := range [][2]int{{0, 2}, {1, 3}} {
		mbit[e[0]][e[1]], mbit[e[1]][e[0]] = 500, 500
	}
	m = mbitMatrix(mbit)
	o = PipelineOrder(m, 2, nil)
	sc := scorePipelines(m, o, 2)
	if sc.hop != 1000*1e6/8 || sc.ring != 500*1e6/8 {
		t.Errorf("order %v: slowest hop %.0f Mbit/s and ring edge %.0f, want 1000 and 500", o, sc.hop*8/1e6, sc.ring*8/1e6)
	}
}

// TestPlannerLaysOutPipelines: a planner told of 4 stages orders the
// epoch so that each pipeline sits in one rack, and re-plans a current
// epoch whose pipelines straddle the racks but not its own plan.
func TestPlannerLaysOutPipelines(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	mbit := racks(8, []int{0, 5, 6, 7})
	members := linkMembers(ids, mbit)
	stages := 4
	p := NewPlanner(defaultSettings()).WithStages(func() int { return stages })
	plan := p.Plan(ids, members)
	rack := func(id string) bool { return slices.Contains([]string{"a", "f", "g", "h"}, id) }
	for r := range 2 {
		pl := plan.Order[r*4 : r*4+4]
		for _, id := range pl {
			if rack(id) != rack(pl[0]) {
				t.Fatalf("pipeline %v of order %v straddles the racks", pl, plan.Order)
			}
		}
	}
	if plan.Schedule != "auto" {
		t.Errorf("schedule %q, want the configured auto", plan.Schedule)
	}
	checkReplans(t, p, ids, members, plan, "pipelines across the racks")
	// Told of no pipelines (auto before its choice), it plans the ring.
	stages = 1
	if got := p.Plan(ids, members); !slices.Equal(got.Order, NewPlanner(defaultSettings()).Plan(ids, members).Order) {
		t.Errorf("one stage: order %v, want the ring planner's", got.Order)
	}
}

// checkReplans checks that p re-plans an epoch ordered as ids (what
// describes) into plan, and not an epoch ordered as plan into its own
// plan again.
func checkReplans(t *testing.T, p Planner, ids []string, members []gossip.Member, plan gossip.EpochPlan, what string) {
	t.Helper()
	cur := gossip.Epoch{Number: 2, Order: ids, Coordinator: ids[0], Schedule: "auto"}
	if !p.Replan(cur, plan, members) {
		t.Errorf("no replan from %s to %v", what, plan.Order)
	}
	own := gossip.Epoch{Number: 3, Order: plan.Order, Coordinator: plan.Order[0], Schedule: "auto"}
	if p.Replan(own, p.Plan(ids, members), members) {
		t.Errorf("replan of the planned layout %v", plan.Order)
	}
}

// TestPipelineOrderNeverWorseThanTheRing compares, over 300 seeded
// random clusters of 6 to 12 members in three racks and 2, 3 and 4
// stages, PipelineOrder's layout with RingOrder's cut from its start: it
// never ranks lower, and the test logs how often its slowest hop is
// faster (docs/pipeline.md quotes the count).
func TestPipelineOrderNeverWorseThanTheRing(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	better, total := 0, 0
	for trial := range 300 {
		rackOf := make([]int, 6+trial%7)
		for i := range rackOf {
			rackOf[i] = rng.IntN(3)
		}
		m := mbitMatrix(rackMatrix(rackOf))
		for stages := 2; stages <= 4; stages++ {
			total++
			ring, pipe := scorePipelines(m, RingOrder(m), stages), scorePipelines(m, PipelineOrder(m, stages, nil), stages)
			if ring.better(pipe) {
				t.Fatalf("racks %v, %d stages: the pipeline order ranks %+v, the ring's %+v", rackOf, stages, pipe, ring)
			}
			if pipe.hop > ring.hop {
				better++
			}
		}
	}
	t.Logf("the pipeline order's slowest hop is faster than the ring's in %d of %d layouts", better, total)
}

// TestLayoutRatesPerHop: two pipelines of three stages (order 0 1 2 | 3 4
// 5); the second pipeline's first hop is slow. Hop 0 takes the slowest of
// the pipelines' links there, hop 1 stays fast, and the stages' rings'
// slowest edge is reported apart.
func TestLayoutRatesPerHop(t *testing.T) {
	mbit := fastRing(6, nil, 1000, 1000)
	mbit[3][4], mbit[4][3] = 20, 20
	mbit[1][4], mbit[4][1] = 100, 100
	hops, ring := LayoutRates(mbitMatrix(mbit), []int{0, 1, 2, 3, 4, 5}, 3)
	if want := []float64{20e6 / 8, 1000e6 / 8}; !slices.Equal(hops, want) || ring != 100e6/8 {
		t.Errorf("hops %v, ring %v bytes/s; want %v and %v", hops, ring, want, 100e6/8)
	}
}
