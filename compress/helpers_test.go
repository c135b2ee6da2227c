package compress

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// mustNew builds a codec or fails the test.
func mustNew(t testing.TB, spec string, opts Options) Codec {
	t.Helper()
	c, err := New(spec, opts)
	if err != nil {
		t.Fatalf("New(%q): %v", spec, err)
	}
	return c
}

// roundTrip encodes src at pos and decodes it.
func roundTrip(t testing.TB, c Codec, src []float32, pos Pos) []float32 {
	t.Helper()
	b, err := c.Encode(nil, src, pos)
	if err != nil {
		t.Fatalf("%s: Encode: %v", c.Spec(), err)
	}
	out := make([]float32, len(src))
	if err := c.Decode(out, b); err != nil {
		t.Fatalf("%s: Decode: %v", c.Spec(), err)
	}
	return out
}

// gradient returns n seeded heavy-tailed values.
func gradient(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 0x9e37))
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(r.NormFloat64() * math.Exp(r.NormFloat64()) * 1e-3)
	}
	return g
}

// near reports whether got and want agree within tol (absolute).
func near(got, want []float32, tol float64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if math.Abs(float64(got[i])-float64(want[i])) > tol {
			return false
		}
	}
	return true
}

func formatInt(i int) string { return strconv.Itoa(i) }

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
