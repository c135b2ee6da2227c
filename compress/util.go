package compress

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
)

// grow appends n bytes to dst and returns the extended slice and its new tail.
// It allocates only when cap(dst) is too small.
func grow(dst []byte, n int) (all, tail []byte) {
	l := len(dst)
	if cap(dst)-l < n {
		nd := make([]byte, l, l+n+l/4)
		copy(nd, dst)
		dst = nd
	}
	dst = dst[:l+n]
	return dst, dst[l:]
}

// numBlocks returns ceil(n / block).
func numBlocks(n, block int) int { return (n + block - 1) / block }

// checkRegion reports whether [pos.Offset, pos.Offset+n) lies inside a layout of total values.
func checkRegion(name string, pos Pos, n, total int) error {
	if pos.Offset < 0 || n > total || pos.Offset > total-n {
		return fmt.Errorf("%s: encode [%d, %d) outside a bucket of %d values: %w",
			name, pos.Offset, pos.Offset+n, total, ErrShape)
	}
	return nil
}

// corruptf returns an error wrapping ErrCorrupt.
func corruptf(name, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", name, fmt.Sprintf(format, args...), ErrCorrupt)
}

// checkLen validates an exact payload length.
func checkLen(name string, got, want, n int) error {
	if got != want {
		return corruptf(name, "payload of %d bytes for %d values, want %d", got, n, want)
	}
	return nil
}

// absBits returns the bits of |f|. As unsigned integers these order every
// finite value below +Inf, and +Inf below every NaN.
func absBits(f float32) uint32 { return math.Float32bits(f) & 0x7fffffff }

// absMaxBits returns the largest absBits of src (0 for an empty slice).
func absMaxBits(src []float32) uint32 {
	var m uint32
	if n := len(src) &^ 31; useAVX2 && n > 0 {
		m = absMaxBitsAVX2(&src[0], n)
		src = src[n:]
	}
	return max(m, absMaxBitsGo(src))
}

// absMaxBitsGo is absMaxBits in pure Go.
func absMaxBitsGo(src []float32) uint32 {
	var m0, m1, m2, m3 uint32
	i := 0
	for ; i+4 <= len(src); i += 4 {
		m0 = max(m0, absBits(src[i]))
		m1 = max(m1, absBits(src[i+1]))
		m2 = max(m2, absBits(src[i+2]))
		m3 = max(m3, absBits(src[i+3]))
	}
	for ; i < len(src); i++ {
		m0 = max(m0, absBits(src[i]))
	}
	return max(m0, m1, m2, m3)
}

// absMax returns max |src[i]|: NaN if any value is NaN, else +Inf if any is infinite.
func absMax(src []float32) float32 { return math.Float32frombits(absMaxBits(src)) }

// canonicalNaN is the quiet NaN stored for a block whose input was not finite.
var canonicalNaN = math.Float32frombits(0x7fc00000)

func isFinite(f float32) bool { return absBits(f) < 0x7f800000 }

func isNaN(f float32) bool { return absBits(f) > 0x7f800000 }

// degenerate handles a block whose absmax is zero or not finite: it zeroes the
// codes in out and returns the scale to store (0 or NaN) and true.
func degenerate(out []byte, absmax float32) (float32, bool) {
	if isFinite(absmax) && absmax != 0 {
		return 0, false
	}
	clear(out)
	if absmax == 0 {
		return 0, true
	}
	return canonicalNaN, true
}

// validScale reports whether a stored non-negative scale is acceptable:
// finite and >= 0, or NaN (the marker of a block with non-finite input).
func validScale(s float32) bool { return isNaN(s) || (s >= 0 && isFinite(s)) }

func putF32(b []byte, f float32) { binary.LittleEndian.PutUint32(b, math.Float32bits(f)) }

func getF32(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }

// sumSq returns the sum of squares of src in float64, in a fixed order.
func sumSq(src []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	if n := len(src) &^ 3; useAVX2 && n > 0 {
		var acc [4]float64
		sumSqAVX2(&src[0], n, &acc)
		s0, s1, s2, s3 = acc[0], acc[1], acc[2], acc[3]
		i = n
	}
	for ; i+4 <= len(src); i += 4 {
		a, b, c, d := float64(src[i]), float64(src[i+1]), float64(src[i+2]), float64(src[i+3])
		s0 += float64(a * a)
		s1 += float64(b * b)
		s2 += float64(c * c)
		s3 += float64(d * d)
	}
	for ; i < len(src); i++ {
		a := float64(src[i])
		s0 += float64(a * a)
	}
	return (s0 + s1) + (s2 + s3)
}

// sumAbs returns the sum of |a[i]| in float64, in a fixed order, where
// a = src, or, when r is not nil, a = r + src (stored into r).
func sumAbs(src, r []float32) float64 {
	if r != nil {
		r = r[:len(src)]
	}
	var s0, s1, s2, s3 float64
	i := 0
	if n := len(src) &^ 3; useAVX2 && n > 0 {
		var acc [4]float64
		var rp *float32
		if r != nil {
			rp = &r[0]
		}
		sumAbsAVX2(&src[0], rp, n, &acc)
		s0, s1, s2, s3 = acc[0], acc[1], acc[2], acc[3]
		i = n
	}
	for ; i+4 <= len(src); i += 4 {
		x := src[i : i+4 : i+4]
		a, b, c, d := x[0], x[1], x[2], x[3]
		if r != nil {
			y := r[i : i+4 : i+4]
			a, b, c, d = a+y[0], b+y[1], c+y[2], d+y[3]
			y[0], y[1], y[2], y[3] = a, b, c, d
		}
		s0 += float64(math.Float32frombits(absBits(a)))
		s1 += float64(math.Float32frombits(absBits(b)))
		s2 += float64(math.Float32frombits(absBits(c)))
		s3 += float64(math.Float32frombits(absBits(d)))
	}
	for ; i < len(src); i++ {
		a := src[i]
		if r != nil {
			a += r[i]
			r[i] = a
		}
		s0 += float64(math.Float32frombits(absBits(a)))
	}
	return (s0 + s1) + (s2 + s3)
}

// mix64 is the splitmix64 finaliser, a bijective 64-bit hash.
func mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	return z ^ z>>31
}

const golden = 0x9e3779b97f4a7c15

// streamKey derives the key of a counter-based random stream from a peer's
// seed and the position of an encode.
func streamKey(seed uint64, pos Pos) uint64 {
	h := mix64(seed + golden)
	h = mix64(h ^ pos.Step + 0x6a09e667f3bcc909)
	h = mix64(h ^ uint64(pos.Stream) + 0xbb67ae8584caa73b)
	return mix64(h ^ uint64(pos.Offset) + 0x3c6ef372fe94f82b)
}

// wyInc is the Weyl-sequence increment of wyrand.
const wyInc = 0xa0761d6478bd642f

// wyrand returns 64 random bits for counter state x (wyrand's output function:
// one 64×64→128-bit multiply).
func wyrand(x uint64) uint64 {
	hi, lo := bits.Mul64(x, x^0xe7037ed1a0b428db)
	return hi ^ lo
}

// fillUniform writes into u the values first, first+1, … of the random stream
// key: uniform in [0, 1) with 24-bit resolution. Element i of a stream is the
// low or high lane (i%2) of wyrand(key + (i/2)·wyInc), so it does not depend on
// which slice of the stream is filled.
func fillUniform(u []float32, key uint64, first int) {
	const inv = 1.0 / (1 << 24)
	if len(u) == 0 {
		return
	}
	c := uint64(first / 2)
	if first%2 == 1 {
		u[0] = float32(wyrand(key+c*wyInc)>>8&0xffffff) * inv
		u = u[1:]
		c++
	}
	i := 0
	if n := len(u) &^ 7; useAVX2 && n > 0 {
		fillUniformAVX2(&u[0], n, key+c*wyInc)
		i = n
		c += uint64(n / 2)
	}
	for ; i+2 <= len(u); i += 2 {
		r := wyrand(key + c*wyInc)
		u[i] = float32(r>>40) * inv
		u[i+1] = float32(r>>8&0xffffff) * inv
		c++
	}
	if i < len(u) {
		u[i] = float32(wyrand(key+c*wyInc)>>40) * inv
	}
}

// uniform16 returns element i of the 16-bit-resolution stream key: lane i%4 of
// wyrand(key + (i/4)·wyInc), as a float32 in [0, 1).
func uniform16(key uint64, i int) float32 {
	return float32(wyrand(key+uint64(i/4)*wyInc)>>(16*(i%4))&0xffff) * (1.0 / (1 << 16))
}

// residual is error-feedback state: one value per element of the bucket,
// allocated on first use.
type residual struct {
	n int
	e []float32
}

// region returns the residual values of the n elements at pos.Offset.
func (r *residual) region(pos Pos, n int) []float32 {
	if r.e == nil {
		r.e = make([]float32, r.n)
	}
	return r.e[pos.Offset : pos.Offset+n]
}

// Reset zeroes the residuals.
func (r *residual) Reset() { clear(r.e) }
