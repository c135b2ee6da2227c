package curves

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image/png"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/telemetry"
	"gonum.org/v1/plot/plotter"
)

// synthetic returns a run of steps records with a noisy, decaying loss,
// an evaluation every 50 steps and a done event; rate sets how fast the
// loss falls and stepS the seconds per step.
func synthetic(name string, seed uint64, steps int, rate, stepS float64, bpb bool) Run {
	rng := rand.New(rand.NewPCG(seed, 1))
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	recs := []telemetry.Record{{Kind: telemetry.KindEvent, Time: t0, Event: telemetry.EventEpoch, Run: "peer0"}}
	for i := 1; i <= steps; i++ {
		at := t0.Add(time.Duration(float64(i) * stepS * float64(time.Second)))
		loss := 0.3 + 2*math.Exp(-rate*float64(i)) + 0.1*rng.NormFloat64()
		recs = append(recs, telemetry.Record{Kind: telemetry.KindStep, Time: at, Step: uint64(i), Loss: loss, Run: "peer0"})
		if i%50 == 0 {
			v := 1 - math.Exp(-rate*float64(i))
			r := telemetry.Record{Kind: telemetry.KindEval, Time: at, Step: uint64(i), Run: "peer0"}
			if bpb {
				v = 8 - 4*v
				r.BitsPerByte = &v
			} else {
				r.Accuracy = &v
			}
			recs = append(recs, r)
		}
	}
	recs = append(recs, telemetry.Record{Kind: telemetry.KindEvent, Step: uint64(steps), Event: telemetry.EventDone, Run: "peer0"})
	return Run{Name: name, Records: recs}
}

func twoRuns() []Run {
	return []Run{
		synthetic("codec-none", 1, 300, 0.02, 0.05, false),
		synthetic("codec-sint8", 2, 300, 0.015, 0.02, false),
	}
}

// svgText parses an SVG document and returns the text of its text elements.
func svgText(t *testing.T, b []byte) []string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var texts []string
	inText, root := false, ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			inText = tok.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, strings.TrimSpace(string(tok)))
			}
		case xml.EndElement:
			inText = false
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return texts
}

func TestWriteSVGHasLegendAndLabels(t *testing.T) {
	var buf bytes.Buffer
	if err := Write(&buf, SVG, twoRuns(), Options{Title: "codecs", Smoothing: DefaultSmoothing}); err != nil {
		t.Fatal(err)
	}
	texts := strings.Join(svgText(t, buf.Bytes()), "\n")
	for _, want := range []string{"codec-none", "codec-sint8", "codecs", "step", "training loss (nats)", "test accuracy (%)", "wall time since start (s)"} {
		if !strings.Contains(texts, want) {
			t.Errorf("the SVG has no text %q; its texts:\n%s", want, texts)
		}
	}
}

func TestWritePNGHasTheSizeAsked(t *testing.T) {
	for _, size := range [][2]int{{0, 0}, {900, 300}, {641, 333}} {
		var buf bytes.Buffer
		if err := Write(&buf, PNG, twoRuns(), Options{Width: size[0], Height: size[1], Smoothing: DefaultSmoothing}); err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(&buf)
		if err != nil {
			t.Fatalf("%v: not a PNG: %v", size, err)
		}
		want := size
		if want[0] == 0 {
			want = [2]int{3 * PanelWidth, Height}
		}
		if b := img.Bounds(); b.Dx() != want[0] || b.Dy() != want[1] {
			t.Errorf("asked for %v: the PNG is %dx%d, want %dx%d", size, b.Dx(), b.Dy(), want[0], want[1])
		}
	}
}

func TestEvalPanelShowsBitsPerByte(t *testing.T) {
	runs := []Run{synthetic("gpt", 3, 200, 0.01, 0.1, true)}
	var buf bytes.Buffer
	if err := Write(&buf, SVG, runs, Options{Panels: []Panel{PanelEval}}); err != nil {
		t.Fatal(err)
	}
	texts := strings.Join(svgText(t, buf.Bytes()), "\n")
	if !strings.Contains(texts, "held-out bits per byte") || strings.Contains(texts, "accuracy") {
		t.Errorf("the evaluation panel of a run with bits per byte is not labelled with them; texts:\n%s", texts)
	}
}

func TestPanelsWithoutDataAreLeftOut(t *testing.T) {
	run := synthetic("x", 4, 60, 0.02, 0.1, false)
	var steps []telemetry.Record
	for _, r := range run.Records {
		if r.Kind == telemetry.KindStep {
			r.Time = time.Time{}
			steps = append(steps, r)
		}
	}
	runs := []Run{{Name: "steps only", Records: steps}}
	got, err := choosePanels(runs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != PanelLoss {
		t.Errorf("panels of a run with no evaluations and no times: %v, want [loss]", got)
	}
	if _, err := choosePanels(runs, []Panel{PanelEval}); err == nil || !strings.Contains(err.Error(), "eval panel") {
		t.Errorf("asking for the eval panel without evaluations: %v, want an error naming it", err)
	}
}

func TestWriteErrors(t *testing.T) {
	events := Run{Name: "events", Records: []telemetry.Record{{Kind: telemetry.KindEvent, Event: telemetry.EventDone}}}
	tests := []struct {
		name string
		runs []Run
		f    Format
		opt  Options
		want string
	}{
		{"no runs", nil, SVG, Options{}, "no runs"},
		{"no steps", []Run{events}, SVG, Options{}, `run "events" has no step records`},
		{"bad smoothing", twoRuns(), SVG, Options{Smoothing: 1}, "smoothing 1 must be in [0, 1)"},
		{"tiny image", twoRuns(), PNG, Options{Width: 10, Height: 10}, "10x10 pixels"},
		{"unknown format", twoRuns(), Format("gif"), Options{}, `unknown image format "gif"`},
		{"unknown panel", twoRuns(), SVG, Options{Panels: []Panel{"speed"}}, `unknown panel "speed"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Write(io.Discard, tt.f, tt.runs, tt.opt)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestFormatOf(t *testing.T) {
	for path, want := range map[string]Format{"a.svg": SVG, "b.PNG": PNG, "dir.x/c.png": PNG} {
		if got, err := FormatOf(path); err != nil || got != want {
			t.Errorf("FormatOf(%q) = %q, %v; want %q", path, got, err, want)
		}
	}
	for _, path := range []string{"curves.gif", "curves"} {
		if _, err := FormatOf(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("FormatOf(%q): %v, want an error naming the file", path, err)
		}
	}
}

func TestParsePanels(t *testing.T) {
	got, err := ParsePanels("time, loss")
	if err != nil || len(got) != 2 || got[0] != PanelTime || got[1] != PanelLoss {
		t.Errorf("ParsePanels(\"time, loss\") = %v, %v", got, err)
	}
	if _, err := ParsePanels("loss,accuracy"); err == nil || !strings.Contains(err.Error(), `"accuracy"`) {
		t.Errorf("ParsePanels with an unknown name: %v", err)
	}
}

func TestEMA(t *testing.T) {
	got := ema(plotter.XYs{{X: 0, Y: 4}, {X: 1, Y: 0}, {X: 2, Y: 0}}, 0.5)
	want := []float64{4, 2, 1}
	for i, w := range want {
		if got[i].Y != w || got[i].X != float64(i) {
			t.Errorf("ema point %d = %v, want (%d, %v)", i, got[i], i, w)
		}
	}
}

func TestFromRecords(t *testing.T) {
	recs := []telemetry.Record{
		{Kind: telemetry.KindEvent, Run: "observer", Event: telemetry.EventEpoch},
		{Kind: telemetry.KindStep, Run: "peer1", Step: 1, Loss: 2},
		{Kind: telemetry.KindStep, Run: "peer0", Step: 1, Loss: 2},
		{Kind: telemetry.KindStep, Run: "peer1", Step: 2, Loss: 1},
	}
	one := FromRecords("none", recs, false)
	if len(one) != 1 || one[0].Name != "none" || len(one[0].Records) != 2 || one[0].Records[0].Run != "peer1" {
		t.Errorf("the first run with steps: %+v", one)
	}
	all := FromRecords("none", recs, true)
	if len(all) != 2 || all[0].Name != "none/peer1" || all[1].Name != "none/peer0" {
		t.Errorf("every peer: %+v", all)
	}
	if got := FromRecords("x", recs[:1], true); len(got) != 0 {
		t.Errorf("a file without steps gave runs %+v", got)
	}
}
