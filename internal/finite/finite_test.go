package finite

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

func naive(v []float32) bool {
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return true
		}
	}
	return false
}

// TestHasMatchesNaive: every special value at every position of slices of
// every length up to 9 (the unrolled body and the tail), and seeded random
// bit patterns, agree with the reference loop.
func TestHasMatchesNaive(t *testing.T) {
	specials := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 0, float32(math.Copysign(0, -1)), 1}
	for n := 0; n <= 9; n++ {
		for pos := 0; pos < n; pos++ {
			for _, s := range specials {
				v := make([]float32, n)
				v[pos] = s
				if got, want := Has(v), naive(v); got != want {
					t.Fatalf("n=%d pos=%d value %v: Has %v, want %v", n, pos, s, got, want)
				}
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		v := make([]float32, 1+r.IntN(12))
		for i := range v {
			v[i] = math.Float32frombits(r.Uint32())
		}
		if Has(v) != naive(v) {
			t.Fatalf("%v: Has %v, want %v", v, Has(v), naive(v))
		}
	}
}

func TestFirstInBytes(t *testing.T) {
	b := make([]byte, 4*5+2) // a trailing partial value is ignored
	if i := FirstInBytes(b); i != -1 {
		t.Fatalf("zeros: %d", i)
	}
	binary.LittleEndian.PutUint32(b[12:], math.Float32bits(float32(math.Inf(-1))))
	binary.LittleEndian.PutUint32(b[16:], math.Float32bits(float32(math.NaN())))
	if i := FirstInBytes(b); i != 3 {
		t.Fatalf("first non-finite at %d, want 3", i)
	}
}

func benchData() []float32 {
	v := make([]float32, 1<<20)
	for i := range v {
		v[i] = float32(i) * 1e-3
	}
	return v
}

func BenchmarkHas(b *testing.B) {
	v := benchData()
	b.SetBytes(int64(4 * len(v)))
	for b.Loop() {
		Has(v)
	}
}

func BenchmarkNaive(b *testing.B) {
	v := benchData()
	b.SetBytes(int64(4 * len(v)))
	for b.Loop() {
		naive(v)
	}
}
