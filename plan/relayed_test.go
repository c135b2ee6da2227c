package plan

import (
	"slices"
	"testing"

	"github.com/p2ptrain/p2ptrain/gossip"
)

// TestMarkRelayed: relayed links count RelayedShare of their figure, an
// unmeasured relayed link RelayedShare of the slowest, direct links stay.
func TestMarkRelayed(t *testing.T) {
	links := []gossip.LinkFigure{{Peer: "b", MbitS: 800, RTTMs: 1}, {Peer: "c", MbitS: 400, RTTMs: 2}}
	got := MarkRelayed(links, map[string]bool{"b": true, "d": true})
	want := []gossip.LinkFigure{{Peer: "b", MbitS: 400, RTTMs: 1}, {Peer: "c", MbitS: 400, RTTMs: 2}, {Peer: "d", MbitS: 200}}
	if !slices.Equal(got, want) {
		t.Fatalf("MarkRelayed = %+v, want %+v", got, want)
	}
	if links[0].MbitS != 800 {
		t.Fatalf("MarkRelayed modified its input: %+v", links)
	}
	if got := MarkRelayed(nil, map[string]bool{"b": true}); len(got) != 0 {
		t.Fatalf("MarkRelayed without measurements = %+v, want none", got)
	}
}

// TestPlannerAvoidsRelayedLink: four peers with equal measured links; a
// and b reach each other only through a relay. Without the mark the ring
// keeps the peer-ID order (a next to b); with it the ring puts a and b
// apart and every edge is direct.
func TestPlannerAvoidsRelayedLink(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	mbit := make([][]float64, 4)
	for i := range mbit {
		mbit[i] = []float64{100, 100, 100, 100}
	}
	members := linkMembers(ids, mbit)
	p := NewPlanner(defaultSettings())
	if plan := p.Plan(ids, members); !slices.Equal(plan.Order, ids) {
		t.Fatalf("equal links: order %v, want the peer-ID order %v", plan.Order, ids)
	}
	for i, rel := range []string{"b", "a"} { // a's relayed peer is b, b's is a
		members[i].Links = MarkRelayed(members[i].Links, map[string]bool{rel: true})
	}
	plan := p.Plan(ids, members)
	for k, id := range plan.Order {
		next := plan.Order[(k+1)%len(plan.Order)]
		if (id == "a" && next == "b") || (id == "b" && next == "a") {
			t.Fatalf("order %v keeps the relayed link a–b as an edge", plan.Order)
		}
	}
	if len(plan.LinkCodecs) != 0 {
		t.Fatalf("ring without relayed edges got per-link codecs %v", plan.LinkCodecs)
	}
}

// TestPlannerCompressesRelayedEdge: in a ring of three every pair is an
// edge, so the relayed one stays; it gets a compressed codec.
func TestPlannerCompressesRelayedEdge(t *testing.T) {
	ids := []string{"a", "b", "c"}
	mbit := [][]float64{{0, 100, 100}, {100, 0, 100}, {100, 100, 0}}
	members := linkMembers(ids, mbit)
	for i, rel := range []string{"b", "a"} {
		members[i].Links = MarkRelayed(members[i].Links, map[string]bool{rel: true})
	}
	s := defaultSettings()
	s.Schedule = "ring"
	plan := NewPlanner(s).Plan(ids, members)
	if len(plan.LinkCodecs) != len(plan.Order) {
		t.Fatalf("plan %+v: want per-link codecs", plan)
	}
	for k, id := range plan.Order {
		next := plan.Order[(k+1)%len(plan.Order)]
		relayed := (id == "a" && next == "b") || (id == "b" && next == "a")
		if c := plan.LinkCodecs[k]; relayed != (c != "none") {
			t.Fatalf("edge %s→%s (relayed %v) has codec %q; codecs %v", id, next, relayed, c, plan.LinkCodecs)
		}
	}
}
