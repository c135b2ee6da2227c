package telemetry

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHistoryKeepsTheLatestRecordsInOrder(t *testing.T) {
	h := NewHistory(3)
	for i := 1; i <= 5; i++ {
		h.Add(Record{Kind: KindStep, Step: uint64(i)})
	}
	recs, last := h.Since(0)
	if last != 5 || len(recs) != 3 {
		t.Fatalf("Since(0) = %d records, last %d; want 3, 5", len(recs), last)
	}
	for i, r := range recs {
		if want := uint64(i + 3); r.Seq != want || r.Step != want {
			t.Errorf("record %d: seq %d step %d, want %d", i, r.Seq, r.Step, want)
		}
		if r.Time.IsZero() {
			t.Errorf("record %d has no time", i)
		}
	}
	if recs, last := h.Since(4); len(recs) != 1 || recs[0].Seq != 5 || last != 5 {
		t.Errorf("Since(4) = %v, %d; want record 5", recs, last)
	}
	if recs, last := h.Since(5); len(recs) != 0 || last != 5 {
		t.Errorf("Since(5) = %v, %d; want none", recs, last)
	}
	if recs, _ := NewHistory(4).Since(0); len(recs) != 0 {
		t.Errorf("an empty history returned %v", recs)
	}
}

func TestFileRoundTripsRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.jsonl")
	f, err := CreateFile(path, "h1")
	if err != nil {
		t.Fatal(err)
	}
	acc := 0.75
	at := time.Date(2026, 11, 25, 7, 0, 0, 0, time.UTC)
	f.Add(Record{Kind: KindStep, Time: at, Step: 1, Loss: 2.5, ComputeS: 0.1, AllreduceS: 0.2, Seq: 9})
	f.Add(Record{Kind: KindEval, Time: at, Step: 1, Accuracy: &acc, Run: "other"})
	f.Add(Record{Kind: KindEvent, Time: at, Step: 1, Event: EventExcluded, Peer: "p", Message: "slow"})
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("read %d records, want 3", len(recs))
	}
	if r := recs[0]; r.Loss != 2.5 || r.AllreduceS != 0.2 || r.Run != "h1" || r.Seq != 0 || !r.Time.Equal(at) {
		t.Errorf("step record read back as %+v", r)
	}
	if r := recs[1]; r.Accuracy == nil || *r.Accuracy != acc || r.Run != "other" {
		t.Errorf("eval record read back as %+v", r)
	}
	if r := recs[2]; r.Event != EventExcluded || r.Peer != "p" || r.Message != "slow" {
		t.Errorf("event record read back as %+v", r)
	}
}

func TestReadRejectsWhatIsNotAMetricsFile(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"bad line", `{"kind":"step","step":1}` + "\nnot json\n" + `{"kind":"step","step":2}` + "\n", "line 2"},
		{"unknown kind", `{"kind":"weather","step":1}` + "\n", `unknown record kind "weather"`},
		{"not jsonl", "hello\n", "line 1"},
	} {
		_, err := Read(strings.NewReader(tc.text), "f")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.want)
		}
	}
}

func TestReadIgnoresALastLineCutShort(t *testing.T) {
	text := `{"kind":"step","step":1}` + "\n" + `{"kind":"step","st`
	recs, err := Read(strings.NewReader(text), "f")
	if err != nil || len(recs) != 1 {
		t.Fatalf("Read = %v, %v; want the one whole record", recs, err)
	}
}

func TestCreateFileNamesThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "m.jsonl")
	if _, err := CreateFile(path, ""); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("CreateFile in a missing directory: %v", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("file created")
	}
}

// TestNonFiniteFiguresAreLeftOut: a diverged loss (NaN, Inf) must not make
// the record unwritable: JSON has no NaN, and one such record would break
// /history and the metrics file for as long as it is kept.
func TestNonFiniteFiguresAreLeftOut(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	r := Record{Kind: KindStep, Step: 3, Loss: nan, StepS: 0.5, SamplesPerS: inf, TestLoss: &nan, Accuracy: &inf}
	h := NewHistory(4)
	h.Add(r)
	recs, _ := h.Since(0)
	if _, err := json.Marshal(recs); err != nil {
		t.Fatalf("history records do not encode: %v", err)
	}
	if got := recs[0]; got.Loss != 0 || got.SamplesPerS != 0 || got.TestLoss != nil || got.Accuracy != nil || got.StepS != 0.5 {
		t.Errorf("history kept %+v", got)
	}
	path := filepath.Join(t.TempDir(), "m.jsonl")
	f, err := CreateFile(path, "")
	if err != nil {
		t.Fatal(err)
	}
	f.Add(r)
	if err := f.Close(); err != nil {
		t.Fatalf("writing a record with a NaN loss: %v", err)
	}
	if recs, err := ReadFile(path); err != nil || len(recs) != 1 || recs[0].StepS != 0.5 {
		t.Fatalf("read back %+v, %v", recs, err)
	}
}
