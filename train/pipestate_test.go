package train

import (
	"slices"
	"strings"
	"testing"
)

// TestChoosePipeState: the members continue from the step most of them
// hold among those at which every stage has a holder, each stage from the
// hash most of its holders announce; with everyone fresh, from step 0;
// with a stage lost, an error naming it.
func TestChoosePipeState(t *testing.T) {
	order := []string{"a", "b", "c", "d", "e"}
	for _, tc := range []struct {
		name   string
		steps  map[string]uint64
		hashes map[string]string
		held   map[string]int
		step   uint64
		want   []string
		err    string
	}{
		{name: "fresh", steps: map[string]uint64{}, held: map[string]int{}, step: 0},
		{name: "calm", steps: map[string]uint64{"a": 5, "b": 5, "c": 5, "d": 5},
			hashes: map[string]string{"a": "x0", "b": "x1", "c": "x0", "d": "x1"},
			held:   map[string]int{"a": 0, "b": 1, "c": 0, "d": 1}, step: 5, want: []string{"x0", "x1"}},
		{name: "a joiner and a replica that disagrees (the lower hash wins a tie)",
			steps:  map[string]uint64{"a": 5, "b": 5, "c": 5, "d": 0},
			hashes: map[string]string{"a": "x0", "b": "x1", "c": "w0", "d": "init"},
			held:   map[string]int{"a": 0, "b": 1, "c": 0, "d": 0}, step: 5, want: []string{"w0", "x1"}},
		{name: "one pipeline applied a step the other did not",
			steps:  map[string]uint64{"a": 6, "b": 6, "c": 5, "d": 5},
			hashes: map[string]string{"a": "y0", "b": "y1", "c": "x0", "d": "x1"},
			held:   map[string]int{"a": 0, "b": 1, "c": 0, "d": 1}, step: 6, want: []string{"y0", "y1"}},
		{name: "the majority step lacks a stage: the next that has every stage",
			steps:  map[string]uint64{"a": 6, "b": 6, "c": 6, "d": 5, "e": 5},
			hashes: map[string]string{"a": "y0", "b": "y0", "c": "y0", "d": "x1", "e": "x0"},
			held:   map[string]int{"a": 0, "b": 0, "c": 0, "d": 1, "e": 0}, step: 5, want: []string{"x0", "x1"}},
		{name: "no step at which every stage has a holder",
			steps:  map[string]uint64{"a": 6, "b": 6, "c": 6, "d": 5},
			hashes: map[string]string{"a": "y0", "b": "y0", "c": "y0", "d": "x1"},
			held:   map[string]int{"a": 0, "b": 0, "c": 0, "d": 1}, err: "stage 1 has none at step 6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			step, want, err := choosePipeState(order, tc.steps, tc.hashes, tc.held, 2, 100)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got step %d %v, %v; want an error saying %q", step, want, err, tc.err)
				}
				return
			}
			if err != nil || step != tc.step || !slices.Equal(want, tc.want) {
				t.Fatalf("got step %d hashes %v, %v; want step %d hashes %v", step, want, err, tc.step, tc.want)
			}
		})
	}
}
