package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// tinyPlan is a plan of the tiny gpt that times its layers quickly.
var tinyPlan = []string{"plan", "--preset", "tiny", "--gpt-context", "16", "--peers", "4", "--batch", "8", "--micro", "2", "--reps", "1"}

// TestPlanJSON checks the JSON report: the timed layers, every feasible
// layout (pure data parallelism per gradient codec; 2×2 and 4×1 per codec
// choice), fastest first, and the fastest named.
func TestPlanJSON(t *testing.T) {
	code, out, errOut := runCLI(t, append(tinyPlan, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep planReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rep.Layers) != 5 || rep.Params != 2*(12*64*64+13*64)+256*64+16*64+2*64 || rep.TimedBatch != 2 {
		t.Errorf("layers %d, params %d, timed batch %d", len(rep.Layers), rep.Params, rep.TimedBatch)
	}
	for _, l := range rep.Layers {
		if l.ForwardS <= 0 || l.BackwardS <= 0 {
			t.Errorf("layer %+v", l)
		}
	}
	count := map[string]int{}
	for i, l := range rep.Layouts {
		count[l.Layout]++
		if i > 0 && l.StepS < rep.Layouts[i-1].StepS {
			t.Errorf("layout %d is faster than the one before", i)
		}
	}
	if count["dp×4"] != 2 || count["2×2"] != 4 || count["4×1"] != 2 || len(rep.Layouts) != 8 {
		t.Errorf("layouts %v", count)
	}
	if rep.Fastest != rep.Layouts[0].Layout || rep.Peers != 4 || rep.Schedule != "1f1b" || rep.LinkBps != 100e6/8 {
		t.Errorf("report %+v", rep)
	}
}

// TestPlanTable checks the table's header, the per-layer table and the
// closing line.
func TestPlanTable(t *testing.T) {
	code, out, errOut := runCLI(t, append(tinyPlan, "--layers", "--top", "3", "--link", "20mbit", "--schedule", "gpipe")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"gpt tiny (2 blocks, d_model 64, 2 heads, context 16, vocab 256)", "4 peers, links 20mbit", "gpipe",
		"tied_head(d=64,v=256)", "LAYOUT  GRAD", "fastest: "} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if rows := strings.Count(out, "\n2×2 ") + strings.Count(out, "\ndp×4 ") + strings.Count(out, "\n4×1 "); rows != 3 {
		t.Errorf("%d layout rows with --top 3:\n%s", rows, out)
	}
}

// TestPlanErrors checks that bad flags are usage errors naming the flag.
func TestPlanErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--preset", "huge"}, "--preset"},
		{[]string{"--peers", "0"}, "--peers"},
		{[]string{"--link", "unlimited"}, "--link"},
		{[]string{"--rtt", "-1ms"}, "--rtt"},
		{[]string{"--schedule", "zigzag"}, "--schedule"},
		{[]string{"--grad-codecs", "nope"}, "--grad-codecs"},
		{[]string{"--act-codecs", "onebit"}, "--act-codecs"},
		{[]string{"--grad-codecs", "powersgd"}, "low-rank"},
	} {
		code, _, errOut := runCLI(t, append([]string{"plan"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("plan %v: exit %d, %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	code, _, errOut := runCLI(t, "plan", "--model", "gpt", "--preset", "tiny", "--gpt-heads", "3", "--reps", "1")
	if code != 1 || !strings.Contains(errOut, "Heads 3") {
		t.Errorf("64 wide, 3 heads: exit %d, %q", code, errOut)
	}
}
