package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/telemetry"
)

// metricsFile writes a metrics file of run named name with steps step
// records and an evaluation every 10 steps, through telemetry.File as
// join --metrics-file does.
func metricsFile(t *testing.T, dir, file, name string, steps int) string {
	t.Helper()
	path := filepath.Join(dir, file)
	f, err := telemetry.CreateFile(path, name)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	f.Add(telemetry.Record{Kind: telemetry.KindEvent, Time: t0, Event: telemetry.EventEpoch, Epoch: 1})
	for i := 1; i <= steps; i++ {
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		f.Add(telemetry.Record{Kind: telemetry.KindStep, Time: at, Step: uint64(i), Loss: 2 / float64(i)})
		if i%10 == 0 {
			acc := 1 - 1/float64(i)
			f.Add(telemetry.Record{Kind: telemetry.KindEval, Time: at, Step: uint64(i), Accuracy: &acc})
		}
	}
	f.Add(telemetry.Record{Kind: telemetry.KindEvent, Time: t0.Add(time.Hour), Step: uint64(steps), Event: telemetry.EventDone})
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestPlotWritesSVGAndPNG(t *testing.T) {
	dir := t.TempDir()
	none := metricsFile(t, dir, "none.jsonl", "peer0", 40)
	sint8 := metricsFile(t, dir, "sint8.jsonl", "peer1", 30)

	svg := filepath.Join(dir, "curves.svg")
	code, stdout, stderr := runCLI(t, "plot", none, "-o", svg, sint8, "--title", "two codecs")
	if code != 0 || stdout != "" || stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and nothing", code, stdout, stderr)
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", ">none</text>", ">sint8</text>", ">two codecs</text>"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the SVG has no %q", want)
		}
	}

	out := filepath.Join(dir, "curves.png")
	code, _, stderr = runCLI(t, "plot", "--label", "fp32", "--label", "int8", "--width", "800", "--height", "300", "-o", out, none, sint8)
	if code != 0 {
		t.Fatalf("png: exit %d, stderr %q", code, stderr)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", out, err)
	}
	if b := img.Bounds(); b.Dx() != 800 || b.Dy() != 300 {
		t.Errorf("the PNG is %dx%d, want 800x300", b.Dx(), b.Dy())
	}
}

func TestPlotErrors(t *testing.T) {
	dir := t.TempDir()
	good := metricsFile(t, dir, "good.jsonl", "peer0", 20)
	notMetrics := writeFile(t, "notes.jsonl", "{\"kind\":\"step\",\"step\":1,\"loss\":2}\nhello\n{\"kind\":\"step\",\"step\":2}\n")
	eventsOnly := writeFile(t, "events.jsonl", `{"time":"2026-01-01T00:00:00Z","kind":"event","step":0,"event":"epoch"}`+"\n")
	out := filepath.Join(dir, "c.svg")
	tests := []struct {
		name string
		args []string
		want []string // every fragment must appear in stderr
	}{
		{"missing file", []string{"plot", "-o", out, filepath.Join(dir, "absent.jsonl")}, []string{"absent.jsonl", "no such file"}},
		{"not a metrics file", []string{"plot", "-o", out, notMetrics}, []string{notMetrics, "line 2", "not a metrics record"}},
		{"no step records", []string{"plot", "-o", out, good, eventsOnly}, []string{eventsOnly, "no step records"}},
		{"unknown extension", []string{"plot", "-o", filepath.Join(dir, "c.gif"), good}, []string{"c.gif", `unknown image format ".gif"`}},
		{"no extension", []string{"plot", "-o", filepath.Join(dir, "curves"), good}, []string{"has no extension"}},
		{"no output", []string{"plot", good}, []string{"-o OUT.svg or -o OUT.png is required"}},
		{"no files", []string{"plot", "-o", out}, []string{"no metrics files given"}},
		{"labels for other files", []string{"plot", "-o", out, "--label", "a", good, good}, []string{"1 --label values for 2 files"}},
		{"unknown panel", []string{"plot", "-o", out, "--panels", "loss,speed", good}, []string{`unknown panel "speed"`}},
		{"bad smoothing", []string{"plot", "-o", out, "--smooth", "1.5", good}, []string{"smoothing 1.5 must be in [0, 1)"}},
		{"bad flag", []string{"plot", "-o", out, "--colour", good}, []string{"-colour", "p2ptrain help plot"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.args...)
			if code != 2 || stdout != "" {
				t.Errorf("exit %d, stdout %q; want 2 and nothing", code, stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not contain %q", stderr, w)
				}
			}
			if strings.Count(strings.TrimSpace(stderr), "\n") > 1 {
				t.Errorf("stderr is more than an error and a hint:\n%s", stderr)
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("a failed plot left %s behind", out)
			}
		})
	}
}

func TestPlotHelp(t *testing.T) {
	code, stdout, stderr := runCLI(t, "help", "plot")
	if code != 0 || stderr != "" || !strings.Contains(stdout, "p2ptrain plot FILE...") || !strings.Contains(stdout, "-label") {
		t.Errorf("help plot: exit %d, stdout %q…, stderr %q", code, first(stdout, 120), stderr)
	}
}
