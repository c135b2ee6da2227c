package compress

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// TestF32FastPathsMatchPortable checks that encodeF32 and decodeF32 give the
// same bits through the copy fast path (aligned buffers) as through the
// value-by-value path (a misaligned payload), NaN payloads and -0 included,
// for odd lengths.
func TestF32FastPathsMatchPortable(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, n := range []int{1, 2, 3, 7, 64, 1001} {
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(rng.NormFloat64())
		}
		src[0] = math.Float32frombits(0x7fc01234) // NaN with a payload
		if n > 1 {
			src[1] = float32(math.Copysign(0, -1))
		}
		want := make([]byte, 4*n)
		for i, v := range src {
			binary.LittleEndian.PutUint32(want[4*i:], math.Float32bits(v))
		}
		got := make([]byte, 4*n)
		encodeF32(got, src)
		if string(got) != string(want) {
			t.Fatalf("n=%d: encodeF32 differs from the little-endian encoding", n)
		}

		aligned := make([]byte, 4*n)
		misaligned := make([]byte, 4*n+1)[1:]
		copy(aligned, want)
		copy(misaligned, want)
		if hostLittleEndian && f32View(aligned, n) == nil {
			t.Fatalf("n=%d: no fast path for an aligned buffer", n)
		}
		if f32View(misaligned, n) != nil {
			t.Fatalf("n=%d: fast path taken for a misaligned buffer", n)
		}
		for _, add := range []bool{false, true} {
			fast, slow := make([]float32, n), make([]float32, n)
			for i := range fast {
				fast[i] = float32(i) * 0.25
				slow[i] = fast[i]
			}
			decodeF32(fast, aligned, add)
			decodeF32(slow, misaligned, add)
			for i := range fast {
				if math.Float32bits(fast[i]) != math.Float32bits(slow[i]) {
					t.Fatalf("n=%d add=%v: value %d: fast %x, portable %x", n, add, i,
						math.Float32bits(fast[i]), math.Float32bits(slow[i]))
				}
			}
			if !add && math.Float32bits(fast[0]) != 0x7fc01234 {
				t.Fatalf("n=%d: NaN payload lost: %x", n, math.Float32bits(fast[0]))
			}
		}
	}
}
