package pipeline

import (
	"slices"
	"strings"
	"testing"
)

// TestAssign: pipelines are runs of S consecutive members of the order,
// stage s's replicas the members at positions s, s+S, …; the leftover
// members idle; every member has one place; fewer members than stages is
// an error naming both counts.
func TestAssign(t *testing.T) {
	order := []string{"a", "b", "c", "d", "e"}
	l, err := Assign(order, 2)
	if err != nil {
		t.Fatal(err)
	}
	if l.Stages != 2 || l.Replicas != 2 || !slices.Equal(l.Idle, []string{"e"}) {
		t.Fatalf("layout %v", l)
	}
	if !slices.Equal(l.Pipelines[0], []string{"a", "b"}) || !slices.Equal(l.Pipelines[1], []string{"c", "d"}) {
		t.Fatalf("pipelines %v", l.Pipelines)
	}
	if !slices.Equal(l.StageMembers(0), []string{"a", "c"}) || !slices.Equal(l.StageMembers(1), []string{"b", "d"}) {
		t.Fatalf("stage members %v %v", l.StageMembers(0), l.StageMembers(1))
	}
	for i, p := range order[:4] {
		s, r, ok := l.Place(p)
		if !ok || s != i%2 || r != i/2 {
			t.Errorf("%s placed at stage %d replica %d (%v)", p, s, r, ok)
		}
	}
	if _, _, ok := l.Place("e"); ok {
		t.Error("an idle member has a place")
	}
	if got := l.String(); got != "2×2 [a b] [c d] idle [e]" {
		t.Errorf("String %q", got)
	}
	one, err := Assign(order, 1)
	if err != nil || one.Replicas != 5 || len(one.Idle) != 0 {
		t.Fatalf("one stage: %v, %v", one, err)
	}
	if _, err := Assign(order[:2], 3); err == nil || !strings.Contains(err.Error(), "2 members cannot hold 3 stages") {
		t.Fatalf("2 members in 3 stages: %v", err)
	}
}
