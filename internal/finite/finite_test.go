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
// every length up to 40 (two sixteen-value blocks and every tail length),
// and seeded random bit patterns, agree with the reference loop.
func TestHasMatchesNaive(t *testing.T) {
	bits := math.Float32frombits
	specials := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
		bits(0x7f800001), bits(0xffc00000), bits(0xffffffff), // signalling, negative and all-ones NaNs
		math.MaxFloat32, -math.MaxFloat32, bits(0x7f000000), // the largest exponent that is finite
		math.SmallestNonzeroFloat32, 0, float32(math.Copysign(0, -1)), 1}
	for n := 0; n <= 40; n++ {
		for pos := 0; pos < n; pos++ {
			for _, s := range specials {
				v := make([]float32, n)
				for i := range v {
					v[i] = -math.MaxFloat32 // every lane's exponent one short of all ones, sign set
				}
				v[pos] = s
				if got, want := Has(v), naive(v); got != want {
					t.Fatalf("n=%d pos=%d value %v: Has %v, want %v", n, pos, s, got, want)
				}
				if got, want := Has(v[pos:pos+1]), naive(v[pos:pos+1]); got != want {
					t.Fatalf("alone, value %v: Has %v, want %v", s, got, want)
				}
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		v := make([]float32, 1+r.IntN(40))
		for i := range v {
			v[i] = math.Float32frombits(r.Uint32())
		}
		if Has(v) != naive(v) {
			t.Fatalf("%v: Has %v, want %v", v, Has(v), naive(v))
		}
	}
}

// TestHasEveryPosition: in a slice of 4096+7 finite values starting at
// every offset 0-3 (so that words straddle differently), a NaN or ±Inf
// at any one position is found, and none is reported without one.
func TestHasEveryPosition(t *testing.T) {
	base := make([]float32, 4096+7+3)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range base {
		base[i] = float32(r.NormFloat64()) * 1e30
	}
	for shift := range 4 {
		v := base[shift : shift+4096+7]
		if Has(v) {
			t.Fatalf("shift %d: a finite slice reported non-finite", shift)
		}
		for _, s := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
			for pos := range v {
				old := v[pos]
				v[pos] = s
				if !Has(v) {
					t.Fatalf("shift %d: %v at position %d of %d not found", shift, s, pos, len(v))
				}
				v[pos] = old
			}
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
