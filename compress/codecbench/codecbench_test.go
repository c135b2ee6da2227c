package codecbench

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/compress"
)

// TestRun measures every codec on a small input and checks the output formats.
func TestRun(t *testing.T) {
	rs, err := Run(Config{Size: 5000, Repeats: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(compress.Specs()) {
		t.Fatalf("%d results for %d codecs", len(rs), len(compress.Specs()))
	}
	for _, r := range rs {
		if r.Ratio < 1 || r.RelError < 0 || r.RelError > 1.5 || r.EncodeGBps <= 0 || r.DecodeGBps <= 0 {
			t.Errorf("implausible result %+v", r)
		}
		if r.Codec == "none" && (r.Ratio != 1 || r.RelError != 0) {
			t.Errorf("none: %+v", r)
		}
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, rs); err != nil {
		t.Fatal(err)
	}
	var objs []map[string]any
	if err := json.Unmarshal(js.Bytes(), &objs); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if len(o) != 5 || o["codec"] == nil || o["ratio"] == nil || o["encode_gbps"] == nil ||
			o["decode_gbps"] == nil || o["rel_error"] == nil {
			t.Fatalf("JSON object %v lacks the fields", o)
		}
	}
	var tb bytes.Buffer
	if err := WriteTable(&tb, rs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tb.String(), "qsgd:bits=4,block=512,norm=l2") {
		t.Errorf("table:\n%s", tb.String())
	}
	if _, err := Run(Config{Size: 10, Codecs: []string{"zstd"}}); err == nil {
		t.Error("unknown codec accepted")
	}
}

// TestInputDeterministic checks the input depends only on the seed.
func TestInputDeterministic(t *testing.T) {
	a, b := Input(3, 1000), Input(3, 1000)
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("Input is not deterministic")
		}
	}
}

// TestCodingSeconds: every codec asked for gets a positive, finite
// seconds per value under its canonical spec; an unknown codec is an
// error.
func TestCodingSeconds(t *testing.T) {
	got, err := CodingSeconds([]string{"none", "qsgd:bits=4"}, 4096)
	if err != nil {
		t.Fatal(err)
	}
	canon, err := compress.Canonical("qsgd:bits=4")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%v", got)
	}
	for _, spec := range []string{"none", canon} {
		if v, ok := got[spec]; !ok || !(v > 0) || math.IsInf(v, 0) {
			t.Errorf("%s: %g s per value (present %v) in %v", spec, v, ok, got)
		}
	}
	if _, err := CodingSeconds([]string{"nope"}, 4096); err == nil {
		t.Error("an unknown codec was accepted")
	}
}
