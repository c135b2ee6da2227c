package compress

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
)

// conformanceSpecs covers every codec, with defaults and with odd parameters.
var conformanceSpecs = append(Specs(),
	"int8:block=5", "sint8:block=9", "dyn8:block=33", "qsgd:bits=2,block=7", "qsgd:bits=8,norm=linf",
	"qsgd:bits=4,block=31", "onebit:block=13", "sign:block=13", "topk:ratio=0.1,dgc=true", "topk:ratio=1",
	"powersgd:rank=1", "acpsgd:rank=3")

var confLayout = Layout{Shapes: [][]int{{64, 48}, {100}, {7, 3}}}

// confRegions are the slices a ring would encode: the whole bucket for low-rank codecs.
func confRegions(c Codec, n int) [][2]int {
	if c.Class() == ClassLowRank {
		return [][2]int{{0, n}}
	}
	return [][2]int{{0, n}, {0, 1000}, {1000, 1001}, {1001, n}, {17, 17}}
}

func TestConformanceEncodeDecode(t *testing.T) {
	n := confLayout.Len()
	for _, spec := range conformanceSpecs {
		t.Run(spec, func(t *testing.T) {
			opts := Options{Layout: confLayout, Seed: 3, SharedSeed: 4}
			a, b := mustNew(t, spec, opts), mustNew(t, spec, opts)
			for s := range 3 {
				g := gradient(uint64(s), n)
				for _, r := range confRegions(a, n) {
					pos := Pos{Offset: r[0], Step: uint64(s), Stream: 1, Feedback: true}
					src := g[r[0]:r[1]]
					prefix := []byte("abc")
					got, err := a.Encode(prefix, src, pos)
					if err != nil {
						t.Fatal(err)
					}
					want, err := b.Encode(nil, src, pos)
					if err != nil {
						t.Fatal(err)
					}
					if string(got[:3]) != "abc" || !bytes.Equal(got[3:], want) {
						t.Fatalf("append or determinism broken for region %v", r)
					}
					if len(want) > a.MaxEncodedLen(len(src)) {
						t.Fatalf("payload of %d bytes > MaxEncodedLen %d", len(want), a.MaxEncodedLen(len(src)))
					}
					dec := make([]float32, len(src))
					if err := a.Decode(dec, want); err != nil {
						t.Fatal(err)
					}
					acc := gradient(99, len(src))
					for i := range acc {
						if acc[i]+dec[i] != acc[i]+dec[i] {
							t.Fatalf("decoded %g is not finite", dec[i])
						}
					}
					base := append([]float32(nil), acc...)
					if err := a.DecodeAdd(acc, want); err != nil {
						t.Fatal(err)
					}
					for i := range acc {
						if acc[i] != base[i]+dec[i] {
							t.Fatalf("DecodeAdd[%d] = %g, want %g", i, acc[i], base[i]+dec[i])
						}
					}
				}
			}
		})
	}
}

func TestConformanceErrors(t *testing.T) {
	n := confLayout.Len()
	for _, spec := range conformanceSpecs {
		t.Run(spec, func(t *testing.T) {
			c := mustNew(t, spec, Options{Layout: confLayout})
			g := gradient(1, n)
			for _, pos := range []Pos{{Offset: -1}, {Offset: 1}, {Offset: n}} {
				src := g
				if pos.Offset == n {
					src = g[:1]
				}
				dst, err := c.Encode([]byte("x"), src, pos)
				if !errors.Is(err, ErrShape) || string(dst) != "x" {
					t.Errorf("Encode at %d of %d values: err %v, dst %q", pos.Offset, len(src), err, dst)
				}
			}
			p, err := c.Encode(nil, g, Pos{})
			if err != nil {
				t.Fatal(err)
			}
			out := make([]float32, n)
			for _, bad := range [][]byte{p[:len(p)-1], append(append([]byte(nil), p...), 0), nil} {
				if err := c.Decode(out, bad); !errors.Is(err, ErrCorrupt) {
					t.Errorf("Decode of %d bytes (want %d): %v", len(bad), len(p), err)
				}
				if err := c.DecodeAdd(out, bad); !errors.Is(err, ErrCorrupt) {
					t.Errorf("DecodeAdd of %d bytes (want %d): %v", len(bad), len(p), err)
				}
			}
			err = c.Decode(make([]float32, n+64), p)
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShape) {
				t.Errorf("Decode into %d values: %v", n+64, err)
			}
		})
	}
}

func TestConformanceEmpty(t *testing.T) {
	for _, spec := range conformanceSpecs {
		for _, layout := range []Layout{confLayout, {}} {
			c := mustNew(t, spec, Options{Layout: layout})
			if c.Class() == ClassLowRank && layout.Len() != 0 {
				continue
			}
			p, err := c.Encode(nil, []float32{}, Pos{Feedback: true})
			if err != nil {
				t.Fatalf("%s: Encode of nothing: %v", spec, err)
			}
			if err := c.Decode(nil, p); err != nil {
				t.Errorf("%s: Decode of nothing: %v", spec, err)
			}
			if err := c.DecodeAdd([]float32{}, p); err != nil {
				t.Errorf("%s: DecodeAdd of nothing: %v", spec, err)
			}
		}
	}
}

// TestConformanceNonFinite: NaN and Inf are handled as documented: the NaN's
// position decodes to NaN, the Inf's to a non-finite value (±Inf for linear
// codecs), other buckets and tensors stay finite, and the next step is clean.
func TestConformanceNonFinite(t *testing.T) {
	n := confLayout.Len()
	inf := float32(math.Inf(1))
	for _, spec := range conformanceSpecs {
		c := mustNew(t, spec, Options{Layout: confLayout, Seed: 1})
		g := gradient(1, n)
		g[5], g[77] = float32(math.NaN()), inf
		got := roundTrip(t, c, g, Pos{Feedback: true})
		if !isNaN(got[5]) || isFinite(got[77]) || !isFinite(got[n-1]) {
			t.Errorf("%s: decoded NaN→%g, Inf→%g, last %g", spec, got[5], got[77], got[n-1])
		}
		if c.Class() == ClassLinear && got[77] != inf {
			t.Errorf("%s: Inf decoded to %g", spec, got[77])
		}
		for s := 1; s < 3; s++ {
			got = roundTrip(t, c, gradient(uint64(s), n), Pos{Step: uint64(s), Feedback: true})
			for i, x := range got {
				if !isFinite(x) {
					t.Fatalf("%s: step %d after NaN: value %d = %g", spec, s, i, x)
				}
			}
		}
	}
}

func TestConformanceAllocs(t *testing.T) {
	n := confLayout.Len()
	g := gradient(2, n)
	for _, spec := range conformanceSpecs {
		c := mustNew(t, spec, Options{Layout: confLayout})
		buf := make([]byte, 0, c.MaxEncodedLen(n))
		out := make([]float32, n)
		var p []byte
		step := uint64(0)
		encode := func() {
			step++
			var err error
			if p, err = c.Encode(buf[:0], g, Pos{Step: step, Feedback: true}); err != nil {
				t.Fatal(err)
			}
		}
		encode()
		if a := testing.AllocsPerRun(5, encode); a != 0 {
			t.Errorf("%s: Encode allocates %v times", spec, a)
		}
		if a := testing.AllocsPerRun(5, func() { _ = c.Decode(out, p); _ = c.DecodeAdd(out, p) }); a != 0 {
			t.Errorf("%s: Decode allocates %v times", spec, a)
		}
	}
}

func TestSpecs(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"none", "none", ""},
		{" FP16 ", "fp16", ""},
		{"int8", "int8:block=2048", ""},
		{"qsgd", "qsgd:bits=4,block=512,norm=l2", ""},
		{"qsgd:block=256, bits=8", "qsgd:bits=8,block=256,norm=l2", ""},
		{"topk", "topk:ratio=0.01,dgc=false", ""},
		{"topk:dgc=true", "topk:ratio=0.01,dgc=true,momentum=0.9", ""},
		{"powersgd", "powersgd:rank=4", ""},
		{"acpsgd:rank=2", "acpsgd:rank=2", ""},
		{"zstd", "", "valid: none, fp16"},
		{"qsgd:bits=3", "", "want one of 2, 4, 8"},
		{"qsgd:level=3", "", "valid: bits"},
		{"fp16:block=3", "", "takes no parameters"},
		{"int8:block=0", "", "bad block"},
		{"qsgd:bits=4,bucket=512", "", `parameter "bucket" is now called "block" (values per scale): use block=512`},
		{"int8:block=5,block=6", "", "twice"},
		{"topk:ratio=0", "", "bad ratio"},
		{"topk:momentum=0.5", "", "needs dgc=true"},
		{"powersgd:rank", "", "no value"},
	} {
		got, err := Canonical(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || Validate(tc.in) == nil {
				t.Errorf("Canonical(%q) error %v, want one containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Canonical(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
		c := mustNew(t, tc.in, Options{Layout: FlatLayout(10)})
		if c.Spec() != tc.want {
			t.Errorf("Spec() = %q, want %q", c.Spec(), tc.want)
		}
	}
	classes := map[string]Class{"none": ClassLinear, "fp16": ClassLinear, "bf16": ClassLinear, "sint8": ClassSharedScale,
		"int8": ClassQuantized, "dyn8": ClassQuantized, "qsgd": ClassQuantized, "onebit": ClassErrorFeedback,
		"sign": ClassErrorFeedback, "topk": ClassSparse, "powersgd": ClassLowRank, "acpsgd": ClassLowRank}
	for _, s := range Specs() {
		name, _, _ := strings.Cut(s, ":")
		c := mustNew(t, s, Options{Layout: FlatLayout(4)})
		if c.Class() != classes[name] {
			t.Errorf("%s: class %v, want %v", s, c.Class(), classes[name])
		}
		_, shared := c.(SharedScaler)
		_, lowRank := c.(LowRank)
		if shared != (name == "sint8") || lowRank != (c.Class() == ClassLowRank) {
			t.Errorf("%s: SharedScaler %v LowRank %v", s, shared, lowRank)
		}
	}
	if _, err := New("int8", Options{Layout: Layout{Shapes: [][]int{{-1}}}}); !errors.Is(err, ErrShape) {
		t.Errorf("negative shape: %v", err)
	}
	if _, err := New("int8", Options{Layout: Layout{Shapes: [][]int{{1 << 20, 1 << 20}}}}); !errors.Is(err, ErrShape) {
		t.Errorf("huge shape: %v", err)
	}
}
