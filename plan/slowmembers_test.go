package plan

import (
	"slices"
	"testing"
)

// TestSlowMembers: of the places a layout leaves idle, SlowMembers gives
// to the members more than SlowCompute slower than the slowest member the
// layout must train with; unmeasured members count as the median.
func TestSlowMembers(t *testing.T) {
	for _, c := range []struct {
		name    string
		compute []float64
		stages  int
		want    []int
	}{
		{"one slow of 5, 2 stages", []float64{1, 1, 3, 1, 1}, 2, []int{2}},
		{"within the margin", []float64{1, 1, 1.2, 1, 1}, 2, nil},
		{"no idle place", []float64{1, 1, 3, 1}, 2, nil},
		{"one stage", []float64{1, 1, 3, 1, 1}, 1, nil},
		{"nothing measured", []float64{0, 0, 0, 0, 0}, 2, nil},
		{"unmeasured as the median", []float64{0, 1, 3, 1, 0}, 2, []int{2}},
		{"two slow of 5, 3 stages", []float64{1, 4, 1, 5, 1}, 3, []int{1, 3}},
		{"three slow, two places", []float64{1, 4, 3, 5, 1}, 3, []int{1, 3}}, // member 2 must train: the bound is 3
		{"one of two places", []float64{1, 3.5, 3, 5, 1}, 3, []int{3}},       // 3.5 is within 1.25 × 3
		{"nil", nil, 2, nil},
	} {
		if got := SlowMembers(c.compute, c.stages); !slices.Equal(got, c.want) {
			t.Errorf("%s: SlowMembers(%v, %d) = %v, want %v", c.name, c.compute, c.stages, got, c.want)
		}
	}
	if got := TrainingCompute([]float64{1, 1, 3, 1, 2}, 2); got != 2 {
		t.Errorf("TrainingCompute with member 2 idle = %v, want 2 (member 4 trains)", got)
	}
	if got := TrainingCompute([]float64{1, 1, 3, 1, 1}, 1); got != 3 {
		t.Errorf("TrainingCompute of data parallelism = %v, want the slowest, 3", got)
	}
}

// TestPipelineOrderIdlesTheSlowDevice: 5 members, 2 stages, equal links
// but member 3's, which are slower; member 1 computes 3× slower than the
// others. Without compute figures the layout idles member 3 for its
// links; with them it idles member 1, which would hold back every step,
// and lays the other four out on their links.
func TestPipelineOrderIdlesTheSlowDevice(t *testing.T) {
	m := mbitMatrix(slowLinks(fastRing(5, nil, 1000, 1000), 3, 500))
	if o := PipelineOrder(m, 2, nil); o[4] != 3 {
		t.Fatalf("order %v without compute figures: member 3, on the slower links, should sit idle", o)
	}
	compute := []float64{1e-3, 3e-3, 1e-3, 1e-3, 1e-3}
	o := PipelineOrder(m, 2, compute)
	if sorted := slices.Sorted(slices.Values(o)); !slices.Equal(sorted, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("order %v is not a permutation", o)
	}
	if o[4] != 1 {
		t.Errorf("order %v: member 1, 3× slower, should sit idle (last)", o)
	}
}

// TestPlannerIdlesSlowMembers: the ring planner reads the members'
// announced compute, idles the slow one, and re-plans an epoch in which
// it trains.
func TestPlannerIdlesSlowMembers(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e"}
	members := linkMembers(ids, fastRing(5, nil, 1000, 1000))
	for i := range members {
		members[i].ComputeUS = 1000
	}
	members[0].ComputeUS = 4000
	p := NewPlanner(defaultSettings()).WithStages(func() int { return 2 })
	plan := p.Plan(ids, members)
	if plan.Order[4] != "a" {
		t.Fatalf("order %v: a, 4× slower, should sit idle (last)", plan.Order)
	}
	checkReplans(t, p, ids, members, plan, "a layout in which the slow member trains")
}
