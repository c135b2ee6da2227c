package compress

import (
	"math"
	"sync"
)

// Dettmers' 8-bit dynamic tree ("dyn8"): per block one fp32 absmax, then one
// byte per value, [sign][k zero bits][1][6−k fraction bits F] with magnitude
// 10^−k·(0.1 + 0.9·(F + 0.5)/2^(6−k)), k = 0…6, and magnitude bits 0 = zero.
// Encoding picks the nearest codebook value (ties to the smaller magnitude) of
// |x|/absmax. A block holding NaN or ±Inf stores a NaN absmax and decodes to NaN.

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
	if s, ok := degenerate(out, absmax); ok {
		return s
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

func buildDyn8(p params, opts Options) (Codec, error) {
	t := dyn8()
	return &byteCodec{newBase(p.canonical(), ClassQuantized, opts.Layout.Len()), p.int("block"),
		func(out []byte, v []float32) float32 { return dyn8Encode(t, out, v, absMax(v)) },
		func(dst []float32, codes []byte, m float32, add bool) { dyn8Decode(t, dst, codes, m, add) }}, nil
}

// dyn8Decode writes or adds the values of codes for absmax m.
func dyn8Decode(t *dyn8Tables, d []float32, codes []byte, m float32, add bool) {
	tab := &t.signed
	codes = codes[:len(d)]
	if add {
		for i, x := range codes {
			d[i] += tab[x] * m
		}
	} else {
		for i, x := range codes {
			d[i] = tab[x] * m
		}
	}
}
