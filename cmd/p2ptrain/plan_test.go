package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
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

// writePlanTimes times the tiny plan's layers once and returns the file
// of its report, for --layer-times.
func writePlanTimes(t *testing.T) string {
	t.Helper()
	code, out, errOut := runCLI(t, append(slices.Clone(tinyPlan), "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	f := filepath.Join(t.TempDir(), "times.json")
	if err := os.WriteFile(f, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestPlanSlowPeers: with one of 4 peers 3× slower, data parallelism
// computes 3× longer (it trains with the slow peer), and with --idle the
// layout of 3 stages leaves the slow peer idle and computes as timed.
func TestPlanSlowPeers(t *testing.T) {
	times := writePlanTimes(t)
	layouts := func(extra ...string) map[string]planLayout {
		t.Helper()
		code, out, errOut := runCLI(t, append(append(slices.Clone(tinyPlan), "--json", "--idle", "--cpu-costs=false", "--layer-times", times), extra...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var rep planReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatal(err)
		}
		m := map[string]planLayout{}
		for _, l := range rep.Layouts {
			if _, ok := m[l.Layout]; !ok {
				m[l.Layout] = l
			}
		}
		return m
	}
	even, slow := layouts(), layouts("--slow-peers", "1", "--slowdown", "3")
	if d, s := even["dp×4"].PipelineS, slow["dp×4"].PipelineS; math.Abs(s-3*d) > 1e-9*s {
		t.Errorf("dp×4 computes %v s with a 3× slower peer, want 3 × %v", s, d)
	}
	if d, s := even["3×1+1"].PipelineS, slow["3×1+1"].PipelineS; d == 0 || s != d {
		t.Errorf("3×1+1 computes %v s with the slow peer idle, want %v as with even peers", s, d)
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
		{[]string{"--act-link-codecs", "on"}, "--act-link-codecs"},
		{[]string{"--peers", "4", "--slow-peers", "4"}, "--slow-peers"},
		{[]string{"--slow-peers", "1", "--slowdown", "0.5"}, "--slowdown"},
		{[]string{"--slowdown", "NaN"}, "--slowdown"},
	} {
		code, _, errOut := runCLI(t, append([]string{"plan"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("plan %v: exit %d, %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	code, _, errOut := runCLI(t, "plan", "--model", "gpt", "--preset", "tiny", "--gpt-heads", "3", "--reps", "1")
	if code != 2 || !strings.Contains(errOut, "--gpt-d-model: 64 is not a multiple of --gpt-heads (3)") {
		t.Errorf("64 wide, 3 heads: exit %d, %q", code, errOut)
	}
}

// TestPlanLayerTimes checks --layer-times: a report's own layer times give
// the same projection, doubled times double pure data parallelism's compute
// (and raise a pipeline's, less than twice: its transfers stay), and a
// file of another model, or none, is an error naming it.
func TestPlanLayerTimes(t *testing.T) {
	code, out, errOut := runCLI(t, append(tinyPlan, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep planReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	same := filepath.Join(dir, "same.json")
	if err := os.WriteFile(same, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	doubled := rep
	doubled.Layers = slices.Clone(rep.Layers)
	for i := range doubled.Layers {
		doubled.Layers[i].ForwardS *= 2
		doubled.Layers[i].BackwardS *= 2
	}
	b, err := json.Marshal(doubled)
	if err != nil {
		t.Fatal(err)
	}
	twice := filepath.Join(dir, "twice.json")
	if err := os.WriteFile(twice, b, 0o600); err != nil {
		t.Fatal(err)
	}
	project := func(file string) map[string]planLayout {
		t.Helper()
		code, out, errOut := runCLI(t, append(tinyPlan, "--json", "--layer-times", file)...)
		if code != 0 {
			t.Fatalf("--layer-times %s: exit %d: %s", file, code, errOut)
		}
		var r planReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.Device, file) || r.TimedBatch != rep.TimedBatch {
			t.Errorf("device %q, timed batch %d", r.Device, r.TimedBatch)
		}
		m := map[string]planLayout{}
		for _, l := range r.Layouts {
			m[l.Layout+" "+l.GradCodec+" "+l.ActCodec] = l
		}
		return m
	}
	want := map[string]planLayout{}
	for _, l := range rep.Layouts {
		want[l.Layout+" "+l.GradCodec+" "+l.ActCodec] = l
	}
	got, got2 := project(same), project(twice)
	for k, w := range want {
		if !reflect.DeepEqual(got[k], w) {
			t.Errorf("%s: %+v from the file, %+v timed", k, got[k], w)
		}
		// Pure data parallelism's compute is the layers' alone; a pipeline's
		// adds the hops' transfers, which do not change.
		c := got2[k].PipelineS
		if w.Stages == 1 && math.Abs(c-2*w.PipelineS) > 1e-12*c || w.Stages > 1 && !(c > w.PipelineS && c < 2*w.PipelineS) {
			t.Errorf("%s: compute %g s with doubled times, %g s with the file's", k, c, w.PipelineS)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--gpt-layers", "3"}, "has 5 layers, the model 6"},
		{[]string{"--gpt-d-model", "32"}, "layer 0 is"},
	} {
		code, _, errOut := runCLI(t, append(append(slices.Clone(tinyPlan), "--layer-times", same), tc.args...)...)
		if code != 1 || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, same) {
			t.Errorf("%v: exit %d, %q; want 1 and %q", tc.args, code, errOut, tc.want)
		}
	}
	missing := filepath.Join(dir, "missing.json")
	if code, _, errOut := runCLI(t, append(tinyPlan, "--layer-times", missing)...); code != 1 || !strings.Contains(errOut, "--layer-times") {
		t.Errorf("a missing file: exit %d, %q", code, errOut)
	}
}

// TestPlanProcessorCosts checks the processor terms: the report carries
// the figures measured here (the optimizer's step, the transport, each
// codec by its canonical spec) and every layout the update and the
// communication's processor time they price; --cpu-costs=false prices
// neither; --layer-times takes the figures of its file (not measured
// again), refuses a file without them unless --cpu-costs=false, and
// refuses figures out of range.
func TestPlanProcessorCosts(t *testing.T) {
	report := func(args ...string) planReport {
		t.Helper()
		code, out, errOut := runCLI(t, append(append(slices.Clone(tinyPlan), "--json"), args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		var r planReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	rep := report("--optimizer", "adamw")
	c := rep.CPU
	if c == nil || c.Optimizer != "adamw" || !(c.UpdateS > 0) || !(c.MessageS > 0) || !(c.ByteS > 0) || len(c.Codecs) != 2 {
		t.Fatalf("processor figures %+v", c)
	}
	for spec, v := range c.Codecs {
		if !(v > 0) || !(spec == "none" || strings.HasPrefix(spec, "dyn8:")) {
			t.Errorf("codec %q: %g s per value", spec, v)
		}
	}
	for _, l := range rep.Layouts {
		if l.Stages == 1 && math.Abs(l.UpdateS-float64(rep.Params)*c.UpdateS) > 1e-9*l.UpdateS || !(l.CommCPUS > 0) {
			t.Errorf("%s %s: update %g s, communication's processor time %g s", l.Layout, l.GradCodec, l.UpdateS, l.CommCPUS)
		}
	}
	bare := report("--cpu-costs=false")
	if bare.CPU != nil {
		t.Errorf("--cpu-costs=false reported processor figures %+v", bare.CPU)
	}
	for _, l := range bare.Layouts {
		if l.UpdateS != 0 || l.CommCPUS != 0 {
			t.Errorf("--cpu-costs=false: %s priced update %g s and communication %g s", l.Layout, l.UpdateS, l.CommCPUS)
		}
	}

	dir := t.TempDir()
	write := func(name string, r planReport) string {
		t.Helper()
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	slow := rep
	slowCPU := *rep.CPU
	slowCPU.UpdateS = 1e-6 // a thousand times any measured step: it must come from the file
	slow.CPU = &slowCPU
	got := report("--optimizer", "adamw", "--layer-times", write("slow.json", slow))
	for _, l := range got.Layouts {
		if l.Stages == 1 && math.Abs(l.UpdateS-float64(rep.Params)*1e-6) > 1e-9 {
			t.Errorf("%s: update %g s, not the file's %g s per parameter", l.Layout, l.UpdateS, 1e-6)
		}
	}
	if got.CPU == nil || got.CPU.UpdateS != 1e-6 || got.CPU.MessageS != c.MessageS {
		t.Errorf("processor figures %+v from a file with %+v", got.CPU, slowCPU)
	}
	old := rep
	old.CPU = nil
	oldFile := write("old.json", old)
	code, _, errOut := runCLI(t, append(slices.Clone(tinyPlan), "--layer-times", oldFile)...)
	if code != 1 || !strings.Contains(errOut, "--cpu-costs=false") {
		t.Errorf("a file without processor figures: exit %d, %q", code, errOut)
	}
	report("--layer-times", oldFile, "--cpu-costs=false")
	bad := rep
	badCPU := *rep.CPU
	badCPU.ByteS = -1
	bad.CPU = &badCPU
	badFile := write("bad.json", bad)
	code, _, errOut = runCLI(t, append(slices.Clone(tinyPlan), "--layer-times", badFile)...)
	if code != 1 || !strings.Contains(errOut, "out of range") || !strings.Contains(errOut, badFile) {
		t.Errorf("a negative byte cost: exit %d, %q", code, errOut)
	}
	code, _, errOut = runCLI(t, append(slices.Clone(tinyPlan), "--optimizer", "lion")...)
	if code != 2 || !strings.Contains(errOut, "--optimizer") {
		t.Errorf("--optimizer lion: exit %d, %q", code, errOut)
	}
}

// TestPlanPrintsTheSettingsOfItsChoice: when the fastest layout is a
// pipeline, the table ends with the settings that train it (its stages,
// its cut as train.pipeline_split, the batch per pipeline, the
// micro-batches and the codecs), the cut the JSON report gives for it;
// pure data parallelism prints none. Layer times from one file make both
// projections the same.
func TestPlanPrintsTheSettingsOfItsChoice(t *testing.T) {
	code, out, errOut := runCLI(t, append(tinyPlan, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	file := filepath.Join(t.TempDir(), "times.json")
	if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, link := range []string{"1mbit", "100gbit"} {
		args := append(slices.Clone(tinyPlan), "--layer-times", file, "--link", link)
		code, js, errOut := runCLI(t, append(slices.Clone(args), "--json")...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", link, code, errOut)
		}
		var rep planReport
		if err := json.Unmarshal([]byte(js), &rep); err != nil {
			t.Fatal(err)
		}
		code, text, errOut := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", link, code, errOut)
		}
		best := rep.Layouts[0]
		if best.Stages == 1 {
			if strings.Contains(text, "to train it") {
				t.Errorf("%s: data parallelism is fastest, yet:\n%s", link, text)
			}
			continue
		}
		var cut []string
		for _, v := range best.Split {
			cut = append(cut, strconv.Itoa(v))
		}
		want := fmt.Sprintf("to train it: --set train.pipeline_stages=%d --set train.pipeline_split=%s --set train.batch_size=%d --set train.micro_batches=2 --set train.activation_codec=%s",
			best.Stages, strings.Join(cut, ","), 8/best.Replicas, best.ActCodec)
		if !strings.Contains(text, want) {
			t.Errorf("%s: fastest %s split %v; no %q in\n%s", link, best.Layout, best.Split, want, text)
		}
	}
}

// TestPlanActLinkCodecs checks --act-link-codecs both: every pipeline
// layout is projected with dyn8 on every hop and with per-link codecs,
// which on links far faster than the compute carry none both ways (the
// same step as none's) and on far slower ones dyn8 (dyn8's step); the
// table labels them.
func TestPlanActLinkCodecs(t *testing.T) {
	file := tinyLayerTimes(t)
	for _, tc := range []struct{ link, hop, same string }{{"1000gbit", "none/none", "none"}, {"1kbit", "dyn8:block=2048/dyn8:block=2048", "dyn8:block=2048"}} {
		args := append(slices.Clone(tinyPlan), "--layer-times", file, "--link", tc.link, "--grad-codecs", "none", "--act-codecs", "none,dyn8", "--act-link-codecs", "both")
		code, js, errOut := runCLI(t, append(slices.Clone(args), "--json")...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.link, code, errOut)
		}
		var rep planReport
		if err := json.Unmarshal([]byte(js), &rep); err != nil {
			t.Fatal(err)
		}
		step := map[string]float64{} // by layout and activation codec
		linked := 0
		for _, l := range rep.Layouts {
			step[l.Layout+" "+l.ActCodec] = l.StepS
			if l.ActLinks == nil {
				continue
			}
			linked++
			if l.ActCodec != "none|bf16|dyn8:block=2048" {
				t.Errorf("%s: %s lists the link codecs %q", tc.link, l.Layout, l.ActCodec)
			}
			for _, h := range l.ActLinks {
				if h != tc.hop {
					t.Errorf("%s: %s's hops carry %v, want %s", tc.link, l.Layout, l.ActLinks, tc.hop)
					break
				}
			}
		}
		if linked != 2 { // 2×2 and 4×1
			t.Errorf("%s: %d layouts with per-link codecs, want 2: %+v", tc.link, linked, rep.Layouts)
		}
		for _, lay := range []string{"2×2", "4×1"} {
			if a, b := step[lay+" none|bf16|dyn8:block=2048"], step[lay+" "+tc.same]; a != b || a == 0 {
				t.Errorf("%s: %s projects %v s with per-link codecs, %v with %s on every hop", tc.link, lay, a, b, tc.same)
			}
		}
		code, text, errOut := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.link, code, errOut)
		}
		if want := "auto:" + shortSpec("dyn8:block=2048") + " ["; !strings.Contains(text, want) {
			t.Errorf("%s: no %q in\n%s", tc.link, want, text)
		}
	}
}

// TestPlanIdle checks --idle: 5 peers of the tiny gpt (5 layers) get
// layouts whose stages do not divide them, named with their idle peers
// and taking 2 samples a step per peer that trains; --idle with a batch
// the peers do not divide is refused.
func TestPlanIdle(t *testing.T) {
	file := tinyLayerTimes(t)
	args := []string{"plan", "--preset", "tiny", "--gpt-context", "16", "--peers", "5", "--batch", "10", "--micro", "2", "--layer-times", file,
		"--grad-codecs", "none", "--act-codecs", "dyn8", "--idle", "--json"}
	code, js, errOut := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep planReport
	if err := json.Unmarshal([]byte(js), &rep); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, l := range rep.Layouts {
		got[l.Layout] = l.Batch
		if want := 2 * (5 - l.Idle); l.Batch != want {
			t.Errorf("%s: batch %d, want %d", l.Layout, l.Batch, want)
		}
	}
	// 2 and 3 stages: 2 pipelines need 2 × 2 micro-batches of the 4 or 6
	// samples; 4 stages take 8 samples in 1 pipeline; 5 stages all 10.
	for _, name := range []string{"dp×5", "2×2+1", "3×1+2", "4×1+1", "5×1"} {
		if _, ok := got[name]; !ok {
			t.Errorf("no layout %s in %v", name, got)
		}
	}
	code, _, errOut = runCLI(t, "plan", "--peers", "4", "--batch", "10", "--idle")
	if code != 2 || !strings.Contains(errOut, "--idle") {
		t.Errorf("--idle with 10 samples on 4 peers: exit %d, %q", code, errOut)
	}
}

// tinyLayerTimes writes tinyPlan's JSON report, the tiny gpt's layer times
// for --layer-times, to a file and returns its path.
func tinyLayerTimes(t *testing.T) string {
	t.Helper()
	code, out, errOut := runCLI(t, append(slices.Clone(tinyPlan), "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	file := filepath.Join(t.TempDir(), "times.json")
	if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}
