package compress

import (
	"math"
	"sync"
)

// Dettmers' 8-bit dynamic tree ("dyn8"): per bucket one fp32 absmax, then one
// byte per value, [sign][k zero bits][1][6−k fraction bits F] with magnitude
// 10^−k·(0.1 + 0.9·(F + 0.5)/2^(6−k)), k = 0…6, and magnitude bits 0 = zero.
// Encoding picks the nearest codebook value (ties to the smaller magnitude) of
// |x|/absmax. A bucket holding NaN or ±Inf stores a NaN absmax and decodes to NaN.

// dyn8Tables holds the codebook and the encoder's lookup tables.
type dyn8Tables struct {
	// value[m] is the magnitude of the 7 magnitude bits m (value[0] = 0); increasing in m.
	value [128]float32
	// mid[m] is the float32 midpoint between value[m] and value[m+1]; mid[127] = +Inf.
	mid [128]float32
	// low[i] is the nearest code to the float32 with bits i<<16, i <= dyn8MaxIdx.
	// Codebook gaps exceed the width of a cell (2^-7 relative), so at most one
	// midpoint lies in a cell and nearest(x) = low[i] + (x > mid[low[i]]).
	low [dyn8MaxIdx + 1]uint8
	// signed[b] is the decoded value of byte b for absmax 1.
	signed [256]float32
}

const dyn8MaxIdx = 0x3f80 // bits(1.0) >> 16

// dyn8Value returns the magnitude coded by the 7 magnitude bits m.
func dyn8Value(m int) float64 {
	if m == 0 {
		return 0
	}
	k := 0
	for m&(0x40>>k) == 0 {
		k++
	}
	fbits := 6 - k
	f := m & (1<<fbits - 1)
	return math.Pow(10, -float64(k)) * (0.1 + 0.9*(float64(f)+0.5)/float64(int(1)<<fbits))
}

var dyn8 = sync.OnceValue(func() *dyn8Tables {
	t := new(dyn8Tables)
	var v [128]float64
	for m := range v {
		v[m] = dyn8Value(m)
		t.value[m] = float32(v[m])
	}
	for m := 0; m < 127; m++ {
		t.mid[m] = float32((v[m] + v[m+1]) / 2)
	}
	t.mid[127] = float32(math.Inf(1))
	for i := range t.low {
		x := math.Float32frombits(uint32(i) << 16)
		c := 0
		for c < 127 && x > t.mid[c] {
			c++
		}
		t.low[i] = uint8(c)
	}
	for b := range t.signed {
		t.signed[b] = t.value[b&0x7f]
		if b&0x80 != 0 {
			t.signed[b] = -t.signed[b]
		}
	}
	return t
})

// dyn8Encode writes the codes of v normalised by absmax and returns the scale to store.
func dyn8Encode(t *dyn8Tables, out []byte, v []float32, absmax float32) float32 {
	out = out[:len(v)]
	if !isFinite(absmax) || absmax == 0 {
		clear(out)
		if absmax == 0 {
			return 0
		}
		return canonicalNaN
	}
	inv := 1 / absmax
	if !isFinite(inv) {
		for i, x := range v {
			a := float32(float64(math.Float32frombits(absBits(x))) / float64(absmax))
			out[i] = dyn8Code(t, a) | byte(math.Float32bits(x)>>24&0x80)
		}
		return absmax
	}
	for i, x := range v {
		a := math.Float32frombits(absBits(x)) * inv
		out[i] = dyn8Code(t, a) | byte(math.Float32bits(x)>>24&0x80)
	}
	return absmax
}

// dyn8Code returns the magnitude code nearest to a in [0, ~1].
func dyn8Code(t *dyn8Tables, a float32) byte {
	idx := min(math.Float32bits(a)>>16, dyn8MaxIdx)
	c := t.low[idx]
	if a > t.mid[c&0x7f] {
		c++
	}
	return c
}

type dyn8Codec struct {
	base
	bucket int
	t      *dyn8Tables
}

func buildDyn8(p params, opts Options) (Codec, error) {
	return &dyn8Codec{base{p.canonical(), ClassQuantized, opts.Layout.Len()}, p.int("bucket"), dyn8()}, nil
}

func (c *dyn8Codec) MaxEncodedLen(n int) int { return bucketedLen(n, c.bucket, 4, identity) }
func (c *dyn8Codec) Reset()                  {}

func (c *dyn8Codec) Encode(dst []byte, src []float32, pos Pos) ([]byte, error) {
	if err := checkRegion("compress: dyn8", pos, len(src), c.total); err != nil {
		return dst, err
	}
	dst, out := grow(dst, c.MaxEncodedLen(len(src)))
	for b := 0; b < len(src); b += c.bucket {
		v := src[b:min(b+c.bucket, len(src))]
		putF32(out, dyn8Encode(c.t, out[4:], v, absMax(v)))
		out = out[4+len(v):]
	}
	return dst, nil
}

func (c *dyn8Codec) Decode(dst []float32, src []byte) error { return c.decode(dst, src, false) }

func (c *dyn8Codec) DecodeAdd(dst []float32, src []byte) error { return c.decode(dst, src, true) }

func (c *dyn8Codec) decode(dst []float32, src []byte, add bool) error {
	const name = "compress: dyn8"
	if err := checkLen(name, len(src), c.MaxEncodedLen(len(dst)), len(dst)); err != nil {
		return err
	}
	tab := &c.t.signed
	for b := 0; b < len(dst); b += c.bucket {
		d := dst[b:min(b+c.bucket, len(dst))]
		m := getF32(src)
		if !validScale(m) {
			return corruptf(name, "bucket %d has absmax %g", b/c.bucket, m)
		}
		codes := src[4 : 4+len(d)]
		if add {
			for i, x := range codes {
				d[i] += tab[x] * m
			}
		} else {
			for i, x := range codes {
				d[i] = tab[x] * m
			}
		}
		src = src[4+len(d):]
	}
	return nil
}
