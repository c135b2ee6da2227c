package compress

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// withTwins runs f with the AVX2 kernels and again with their pure-Go
// twins, and returns both results.
func withTwins[T any](t *testing.T, f func() T) (avx, twin T) {
	t.Helper()
	if !useAVX2 {
		t.Skip("no AVX2 kernels on this machine: only the pure-Go loops run")
	}
	avx = f()
	useAVX2 = false
	defer func() { useAVX2 = true }()
	return avx, f()
}

// TestUnpackBitsTwins: the AVX2 unpacking of sign bits writes and adds
// exactly what the pure-Go loop does, at every length up to 3 bytes past
// a multiple of the kernel's 8 values.
func TestUnpackBitsTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for n := 1; n <= 75; n++ {
		bits := make([]byte, bitBytes(n))
		for i := range bits {
			bits[i] = byte(r.Uint32())
		}
		if n%8 != 0 {
			bits[len(bits)-1] &= byte(1)<<(n%8) - 1 // the padding must be zero
		}
		base := gradient(uint64(n), n)
		vals := [2]float32{float32(-r.Float64()), float32(math.Copysign(0, -1))}
		for _, add := range []bool{false, true} {
			avx, twin := withTwins(t, func() []float32 {
				d := slices.Clone(base)
				if !unpackBits(d, bits, vals, add) {
					t.Fatalf("n %d: padding refused", n)
				}
				return d
			})
			if !bitsEqual32(avx, twin) {
				t.Fatalf("n %d, add %v: AVX2 %v, pure Go %v", n, add, avx, twin)
			}
		}
	}
}

// TestQSGDPack4Twins: the AVX2 packing of 4-bit QSGD codes writes exactly
// the pure-Go loop's bytes, with values at and near the levels, signed
// zeros, and scales that put |x|·scale just above the top level.
func TestQSGDPack4Twins(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for n := 1; n <= 75; n++ {
		v := gradient(uint64(100+n), n)
		u := make([]float32, n)
		for i := range u {
			u[i] = float32(r.Uint32()>>8) / (1 << 24)
		}
		v[0] = float32(math.Copysign(0, -1))
		if n > 3 {
			v[1], v[2], u[2] = 0, 1, 0
		}
		norm := float32(0)
		for _, x := range v {
			norm = max(norm, float32(math.Abs(float64(x))))
		}
		for _, scale := range []float32{7 / norm, 7 / norm * 1.0000001, 3.5 / norm} {
			avx, twin := withTwins(t, func() []byte {
				out := make([]byte, (n+1)/2)
				qsgdPack(out, v, u, scale, 7, 4)
				return out
			})
			if !bytes.Equal(avx, twin) {
				t.Fatalf("n %d, scale %v: AVX2 %x, pure Go %x", n, scale, avx, twin)
			}
		}
	}
}

// bitsEqual32 compares float32 slices bit for bit.
func bitsEqual32(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}
