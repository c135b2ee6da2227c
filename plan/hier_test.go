package plan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/gossip"
)

// uniformLinks returns w peers' rate matrix (bytes/s) and round-trip matrix
// (seconds) with every pair at rate and rtt.
func uniformLinks(w int, rate, rtt float64) (Matrix, Matrix) {
	bw, rt := make(Matrix, w), make(Matrix, w)
	for i := range bw {
		bw[i], rt[i] = make([]float64, w), make([]float64, w)
		for j := range bw[i] {
			if i != j {
				bw[i][j], rt[i][j] = rate, rtt
			}
		}
	}
	return bw, rt
}

func isPermutation(o []int, w int) bool {
	s := slices.Clone(o)
	slices.Sort(s)
	for i, v := range s {
		if v != i {
			return false
		}
	}
	return len(s) == w
}

// TestChooseHierarchicalUniform: at 1 Gbit/s and 50 ms RTT between every
// pair, 256 peers get 16 groups of 16, predicted more than 5× faster than
// the flat ring; 16 peers, bandwidth-bound, keep the ring.
func TestChooseHierarchicalUniform(t *testing.T) {
	bw, rtt := uniformLinks(256, 125e6, 0.05)
	c := ChooseHierarchical(bw, rtt, 64<<20, 0)
	if c.Schedule != "hier-16x16" || !isPermutation(c.Order, 256) {
		t.Errorf("256 peers: %s over %d peers, want hier-16x16", c.Schedule, len(c.Order))
	}
	if c.RingSeconds < 5*c.HierSeconds {
		t.Errorf("256 peers: ring %.3fs, hierarchical %.3fs: less than 5× apart", c.RingSeconds, c.HierSeconds)
	}
	bw, rtt = uniformLinks(16, 125e6, 0.05)
	if c := ChooseHierarchical(bw, rtt, 64<<20, 0); c.Schedule != allreduce.ScheduleRing || !slices.Equal(c.Order, RingOrder(bw)) || c.Groups == nil {
		t.Errorf("16 peers: %s (ring %.3fs, %v %.3fs), want the ring", c.Schedule, c.RingSeconds, c.Groups, c.HierSeconds)
	}
}

// TestChooseHierarchicalRacks: peers in racks, shuffled, 0.2 ms apart
// inside a rack and 50 ms between racks, get a hierarchical layout in
// which no rack is split between groups. (Where bandwidth dominates a group
// may hold several racks: at 1 Gbit/s 64 peers in racks of 8 are predicted
// faster in 2 groups of 4 racks, 4 links of each group ring crossing
// between racks, than in 8 groups of a rack.)
func TestChooseHierarchicalRacks(t *testing.T) {
	for _, k := range []struct {
		racks []int
		rate  float64
	}{
		{[]int{8, 8, 8, 8, 8, 8, 8, 8}, 125e6},
		{[]int{12, 12, 9, 16, 12, 3}, 1250e6},
		{[]int{16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16}, 125e6},
	} {
		var rackOf []int
		for r, n := range k.racks {
			for range n {
				rackOf = append(rackOf, r)
			}
		}
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(rackOf), func(i, j int) { rackOf[i], rackOf[j] = rackOf[j], rackOf[i] })
		w := len(rackOf)
		bw, rtt := uniformLinks(w, k.rate, 0.05)
		for i := range rtt {
			for j := range rtt {
				if i != j && rackOf[i] == rackOf[j] {
					rtt[i][j] = 0.0002
				}
			}
		}
		c := ChooseHierarchical(bw, rtt, 64<<20, 0)
		if !c.Schedule.Hierarchical() || !isPermutation(c.Order, w) {
			t.Fatalf("racks %v: %s over %d peers, want a hierarchical schedule (ring %.3fs, hierarchical %.3fs)",
				k.racks, c.Schedule, len(c.Order), c.RingSeconds, c.HierSeconds)
		}
		groupOf := make(map[int]int) // rack → group
		at := 0
		for g, size := range c.Groups {
			for _, i := range c.Order[at : at+size] {
				if prev, ok := groupOf[rackOf[i]]; ok && prev != g {
					t.Fatalf("racks %v: %s splits rack %d between groups %d and %d", k.racks, c.Schedule, rackOf[i], prev, g)
				}
				groupOf[rackOf[i]] = g
			}
			at += size
		}
		t.Logf("racks %v: %s (ring %.3fs, hierarchical %.3fs)", k.racks, c.Schedule, c.RingSeconds, c.HierSeconds)
	}
}

func TestRTTMatrix(t *testing.T) {
	order := []string{"a", "b", "c"}
	m, known := RTTMatrix(order, map[string][]gossip.LinkFigure{
		"a": {{Peer: "b", RTTMs: 40}, {Peer: "c", RTTMs: -1}},
		"b": {{Peer: "c", RTTMs: 2}},
	})
	if known != 4 || m[0][1] != 0.04 || m[1][0] != 0.04 || m[1][2] != 0.002 || m[2][1] != 0.002 || m[0][2] != 0 {
		t.Fatalf("matrix %v, %d known", m, known)
	}
}

// rttMembers makes members reporting every link at mbit and rtt(i, j) ms.
func rttMembers(ids []string, mbit float64, rtt func(i, j int) float64) []gossip.Member {
	var out []gossip.Member
	for i, id := range ids {
		m := gossip.Member{Heartbeat: gossip.Heartbeat{PeerID: id}}
		for j := range ids {
			if j != i {
				m.Links = append(m.Links, gossip.LinkFigure{Peer: ids[j], MbitS: mbit, RTTMs: rtt(i, j)})
			}
		}
		out = append(out, m)
	}
	return out
}

// TestPlannerProposesHierarchical: with schedule auto and 64 peers 100 ms
// apart the planner proposes a hierarchical epoch, which every member turns
// into the same session schedule, and re-plans a flat ring into it; with
// 0.1 ms round trips it keeps the ring. With schedule hier it proposes the
// groups whatever the prediction.
func TestPlannerProposesHierarchical(t *testing.T) {
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = fmt.Sprintf("p%02d", i)
	}
	far := rttMembers(ids, 1000, func(int, int) float64 { return 100 })
	p := NewPlanner(defaultSettings())
	plan := p.Plan(ids, far)
	sch := allreduce.Schedule(plan.Schedule)
	if !strings.HasPrefix(plan.Schedule, "hier-") || plan.Shares != nil || plan.LinkCodecs != nil {
		t.Fatalf("plan %+v, want a hierarchical schedule", plan)
	}
	if g, err := sch.Groups(len(ids)); err != nil || len(g) < 2 {
		t.Fatalf("%s: groups %v, %v", sch, g, err)
	}
	sorted := slices.Clone(plan.Order)
	slices.Sort(sorted)
	if !slices.Equal(sorted, ids) {
		t.Fatalf("order %v is not a permutation of the members", plan.Order)
	}
	ep := gossip.Epoch{Number: 4, Order: plan.Order, Coordinator: plan.Order[0], Schedule: plan.Schedule}
	for _, self := range []string{ids[0], ids[33]} {
		s := NewEpochSpec(ep, self, allreduce.Config{}, "none", nil)
		if s.Session.Schedule != sch || len(s.Notes) != 0 {
			t.Fatalf("%s's session: schedule %q, notes %v", self, s.Session.Schedule, s.Notes)
		}
	}
	flat := gossip.Epoch{Number: 3, Order: ids, Coordinator: ids[0], Schedule: "auto"}
	if !p.Replan(flat, plan, far) {
		t.Error("no re-plan from the flat ring to the hierarchy at 100 ms round trips")
	}
	if p.Replan(ep, plan, far) {
		t.Error("re-plan of an unchanged hierarchical layout")
	}

	near := rttMembers(ids, 1000, func(int, int) float64 { return 0.1 })
	if plan := p.Plan(ids, near); allreduce.Schedule(plan.Schedule).Hierarchical() {
		t.Errorf("plan %s at 0.1 ms round trips, want no hierarchy", plan.Schedule)
	}
	s := defaultSettings()
	s.Schedule = "hier"
	if plan := NewPlanner(s).Plan(ids, near); !strings.HasPrefix(plan.Schedule, "hier-") {
		t.Errorf("schedule hier: plan %s, want explicit groups", plan.Schedule)
	}
}

// TestEpochSpecHierarchicalGroupsMustFit: an epoch whose hierarchical
// groups do not add up to its members falls back to plain hier (groups of
// about √W) on every member, with a note.
func TestEpochSpecHierarchicalGroupsMustFit(t *testing.T) {
	order := []string{"a", "b", "c", "d", "e"}
	s := NewEpochSpec(gossip.Epoch{Number: 2, Order: order, Coordinator: "a", Schedule: "hier-2x2"}, "a", allreduce.Config{}, "none", nil)
	if s.Session.Schedule != allreduce.ScheduleHierarchical || len(s.Notes) != 1 {
		t.Fatalf("schedule %q, notes %v", s.Session.Schedule, s.Notes)
	}
	s = NewEpochSpec(gossip.Epoch{Number: 2, Order: order, Coordinator: "a", Schedule: "hier-3-2"}, "a", allreduce.Config{}, "none", nil)
	if s.Session.Schedule != "hier-3-2" || len(s.Notes) != 0 {
		t.Fatalf("schedule %q, notes %v", s.Session.Schedule, s.Notes)
	}
}

// BenchmarkChooseHierarchical: the latency-aware layout at 16 to 256 peers
// with uniform links (the planner adds it to Choose's work).
func BenchmarkChooseHierarchical(b *testing.B) {
	for _, w := range []int{16, 64, 256} {
		bw, rtt := uniformLinks(w, 125e6, 0.05)
		b.Run(fmt.Sprint(w), func(b *testing.B) {
			for b.Loop() {
				ChooseHierarchical(bw, rtt, 64<<20, 0)
			}
		})
	}
}

// BenchmarkChooseHierarchicalRacks: 256 peers in racks of 16, 0.2 ms apart
// inside a rack and 50 ms between racks.
func BenchmarkChooseHierarchicalRacks(b *testing.B) {
	bw, rtt := uniformLinks(256, 125e6, 0.05)
	for i := range rtt {
		for j := range rtt {
			if i != j && i/16 == j/16 {
				rtt[i][j] = 0.0002
			}
		}
	}
	for b.Loop() {
		ChooseHierarchical(bw, rtt, 64<<20, 0)
	}
}
