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

// TestFillUniformTwins: the AVX2 uniforms are exactly the pure-Go loop's,
// at every length up to 3 past a multiple of the kernel's 8 values, from
// even and odd starting elements, for keys whose counters wrap around.
func TestFillUniformTwins(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	wrap := uint64(wyInc)
	keys := []uint64{0, ^uint64(0), 0 - 3*wrap, r.Uint64(), r.Uint64()} // 0 − 3·wyInc wraps within a call
	for _, key := range keys {
		for first := 0; first < 4; first++ {
			for n := 1; n <= 75; n++ {
				avx, twin := withTwins(t, func() []float32 {
					u := make([]float32, n)
					fillUniform(u, key, first)
					return u
				})
				if !bitsEqual32(avx, twin) {
					t.Fatalf("key %#x, first %d, n %d: AVX2 %v, pure Go %v", key, first, n, avx, twin)
				}
			}
		}
	}
}

// TestSumSqTwins: the AVX2 sum of squares is the pure-Go loop's to the
// bit, at every length up to 3 past a multiple of 4, with values whose
// squares overflow float32, subnormals and signed zeros.
func TestSumSqTwins(t *testing.T) {
	special := []float32{3e38, -2.5e-39, float32(math.Copysign(0, -1)), 1e-45, 7}
	for n := 1; n <= 75; n++ {
		v := gradient(uint64(200+n), n)
		for i, x := range special {
			if i*7 < n {
				v[i*7] = x
			}
		}
		avx, twin := withTwins(t, func() uint64 { return math.Float64bits(sumSq(v)) })
		if avx != twin {
			t.Fatalf("n %d: AVX2 %v, pure Go %v", n, math.Float64frombits(avx), math.Float64frombits(twin))
		}
	}
}

// TestQSGDDecode4Twins: the AVX2 decoding of 4-bit QSGD codes writes and
// adds exactly what the pure-Go loop does, for every code (signed zeros
// included), at every length up to 3 past a multiple of 8, with a NaN, a
// zero and a huge scale, onto values that hold a NaN and infinities.
func TestQSGDDecode4Twins(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	cod, err := buildQSGD(params{vals: map[string]string{"bits": "4", "block": "512", "norm": "l2"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := cod.(*qsgdCodec)
	for n := 1; n <= 75; n++ {
		codes := make([]byte, (n+1)/2)
		for i := range codes {
			codes[i] = byte(r.Uint32())
		}
		base := gradient(uint64(300+n), n)
		base[0] = float32(math.NaN())
		if n > 9 {
			base[9] = float32(math.Inf(-1))
		}
		for _, scale := range []float32{0.37, 0, float32(math.NaN()), 3e38} {
			for _, add := range []bool{false, true} {
				avx, twin := withTwins(t, func() []float32 {
					d := slices.Clone(base)
					c.decodeBlock(d, codes, scale, add)
					return d
				})
				if !bitsEqual32(avx, twin) {
					t.Fatalf("n %d, scale %g, add %v: AVX2 %v, pure Go %v", n, scale, add, avx, twin)
				}
			}
		}
	}
}
