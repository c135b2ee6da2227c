package compress

import (
	"encoding/binary"
	"math"
	"sync"
)

// base holds what every codec shares.
type base struct {
	spec  string
	name  string // "compress: " + spec, for errors
	class Class
	total int // values in the bucket (Layout.Len())
}

func newBase(spec string, class Class, total int) base {
	return base{spec: spec, name: "compress: " + spec, class: class, total: total}
}

// Spec returns the canonical spec string.
func (b *base) Spec() string { return b.spec }

// Class says how a ring carries the codec.
func (b *base) Class() Class { return b.class }

// linearCodec is an element-wise encoding of width bytes per value (none,
// fp16, bf16): stateless, no header.
type linearCodec struct {
	base
	width int
	enc   func(out []byte, src []float32)
	dec   func(dst []float32, src []byte, add bool)
}

// none: raw little-endian fp32. NaN and Inf pass through bit-exactly.
func buildNone(p params, opts Options) (Codec, error) {
	return &linearCodec{newBase(p.canonical(), ClassLinear, opts.Layout.Len()), 4, encodeF32, decodeF32}, nil
}

// fp16: IEEE half, round-to-nearest-even. |x| >= 65520 becomes ±Inf; NaN stays NaN; Inf stays Inf.
func buildFP16(p params, opts Options) (Codec, error) {
	f16Table() // build the decode table now rather than inside a decode
	return &linearCodec{newBase(p.canonical(), ClassLinear, opts.Layout.Len()), 2, encodeF16, decodeF16}, nil
}

// bf16: top half of fp32, round-to-nearest-even. Overflow rounds to ±Inf; NaN and Inf are kept.
func buildBF16(p params, opts Options) (Codec, error) {
	return &linearCodec{newBase(p.canonical(), ClassLinear, opts.Layout.Len()), 2, encodeBF16, decodeBF16}, nil
}

func (c *linearCodec) MaxEncodedLen(n int) int { return c.width * n }
func (c *linearCodec) Reset()                  {}

func (c *linearCodec) Encode(dst []byte, src []float32, pos Pos) ([]byte, error) {
	if err := checkRegion(c.name, pos, len(src), c.total); err != nil {
		return dst, err
	}
	dst, out := grow(dst, c.width*len(src))
	c.enc(out, src)
	return dst, nil
}

func (c *linearCodec) Decode(dst []float32, src []byte) error { return c.decode(dst, src, false) }

func (c *linearCodec) DecodeAdd(dst []float32, src []byte) error { return c.decode(dst, src, true) }

func (c *linearCodec) decode(dst []float32, src []byte, add bool) error {
	if len(src) != c.width*len(dst) {
		return corruptf(c.name, "payload of %d bytes for %d values, want %d",
			len(src), len(dst), c.width*len(dst))
	}
	c.dec(dst, src, add)
	return nil
}

// put4 writes or adds four values.
func put4(d []float32, a, b, c, e float32, add bool) {
	d = d[:4:4]
	if add {
		d[0] += a
		d[1] += b
		d[2] += c
		d[3] += e
	} else {
		d[0], d[1], d[2], d[3] = a, b, c, e
	}
}

// encodeF32 writes src as little-endian fp32.
func encodeF32(out []byte, src []float32) {
	if b := f32Memory(src); b != nil {
		copy(out[:len(b)], b)
		return
	}
	for len(src) >= 2 && len(out) >= 8 {
		binary.LittleEndian.PutUint64(out, uint64(math.Float32bits(src[0]))|uint64(math.Float32bits(src[1]))<<32)
		src, out = src[2:], out[8:]
	}
	for i, v := range src {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
}

// decodeF32 writes or adds little-endian fp32 values.
func decodeF32(dst []float32, src []byte, add bool) {
	if v := f32View(src, len(dst)); v != nil {
		if !add {
			copy(dst, v)
			return
		}
		dst = dst[:len(v)]
		for i, x := range v {
			dst[i] += x
		}
		return
	}
	for len(dst) >= 2 && len(src) >= 8 {
		x := binary.LittleEndian.Uint64(src)
		a, b := math.Float32frombits(uint32(x)), math.Float32frombits(uint32(x>>32))
		if add {
			dst[0] += a
			dst[1] += b
		} else {
			dst[0], dst[1] = a, b
		}
		dst, src = dst[2:], src[8:]
	}
	for i := range dst {
		if add {
			dst[i] += getF32(src[4*i:])
		} else {
			dst[i] = getF32(src[4*i:])
		}
	}
}

// f32ToF16 converts to IEEE binary16 with round-to-nearest-even (see encodeF16).
func f32ToF16(f float32) uint16 {
	var b [2]byte
	encodeF16(b[:], []float32{f})
	return binary.LittleEndian.Uint16(b[:])
}

// encodeF16 writes src as little-endian IEEE binary16 with round-to-nearest-even:
// values from 65520 up overflow to Inf, small values become subnormal or zero,
// NaN stays a quiet NaN keeping the top payload bits (as x86's VCVTPS2PH does),
// the sign is kept (also of zero). The conversion is written out in the loop so
// that it is inlined (F. Giesen's float_to_half_fast3_rtne, branch-free).
func encodeF16(out []byte, src []float32) {
	out = out[:2*len(src)]
	for i, f := range src {
		x := math.Float32bits(f)
		a := x & 0x7fffffff
		// Normal half: rebias the exponent and round the 13 dropped bits to even.
		h := (a - 112<<23 + 0xfff + (a >> 13 & 1)) >> 13
		// Subnormal half: adding 0.5 makes the FPU round |f|·2^24 to an integer (to even).
		d := math.Float32bits(math.Float32frombits(a)+0.5) - 0x3f000000
		if a < 113<<23 {
			h = d
		}
		if a >= 143<<23 {
			// Inf (or overflow); for NaN (a > 0x7f800000) a quiet NaN with the top payload bits.
			h = 0x7c00 | (0x200|a>>13&0x3ff)&-((0x7f800000-a)>>31)
		}
		h |= x >> 16 & 0x8000
		o := out[2*i : 2*i+2 : 2*i+2]
		o[0], o[1] = byte(h), byte(h>>8)
	}
}

// f16ToF32 converts an IEEE binary16 value to float32 exactly.
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h >> 10 & 0x1f)
	m := uint32(h & 0x3ff)
	switch {
	case e == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	case e == 0:
		v := float32(m) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(v))
	}
	return math.Float32frombits(sign | (e+112)<<23 | m<<13)
}

// f16Table maps every binary16 bit pattern to its float32 value.
var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = f16ToF32(uint16(i))
	}
	return &t
})

// decodeF16 writes or adds little-endian binary16 values, through a table.
func decodeF16(dst []float32, src []byte, add bool) {
	t := f16Table()
	for len(dst) >= 4 && len(src) >= 8 {
		x := binary.LittleEndian.Uint64(src)
		d := dst[:4:4]
		a, b, c, e := t[uint16(x)], t[uint16(x>>16)], t[uint16(x>>32)], t[uint16(x>>48)]
		put4(d, a, b, c, e, add)
		dst, src = dst[4:], src[8:]
	}
	for i := range dst {
		v := t[binary.LittleEndian.Uint16(src[2*i:])]
		if add {
			dst[i] += v
		} else {
			dst[i] = v
		}
	}
}

// f32ToBF16 keeps the top 16 bits of f rounded to nearest even; NaN stays a quiet NaN.
func f32ToBF16(f float32) uint16 {
	x := math.Float32bits(f)
	h := (x + 0x7fff + (x >> 16 & 1)) >> 16
	if x&0x7fffffff > 0x7f800000 {
		h = x>>16 | 0x40
	}
	return uint16(h)
}

// encodeBF16 writes src as little-endian bfloat16 (see f32ToBF16).
func encodeBF16(out []byte, src []float32) {
	for len(src) >= 4 && len(out) >= 8 {
		s := src[:4:4]
		binary.LittleEndian.PutUint64(out, uint64(f32ToBF16(s[0]))|uint64(f32ToBF16(s[1]))<<16|
			uint64(f32ToBF16(s[2]))<<32|uint64(f32ToBF16(s[3]))<<48)
		src, out = src[4:], out[8:]
	}
	for i, v := range src {
		binary.LittleEndian.PutUint16(out[2*i:], f32ToBF16(v))
	}
}

// decodeBF16 writes or adds little-endian bfloat16 values.
func decodeBF16(dst []float32, src []byte, add bool) {
	for len(dst) >= 4 && len(src) >= 8 {
		x := binary.LittleEndian.Uint64(src)
		d := dst[:4:4]
		a := math.Float32frombits(uint32(x) << 16)
		b := math.Float32frombits(uint32(x) &^ 0xffff)
		c := math.Float32frombits(uint32(x>>32) << 16)
		e := math.Float32frombits(uint32(x>>32) &^ 0xffff)
		put4(d, a, b, c, e, add)
		dst, src = dst[4:], src[8:]
	}
	for i := range dst {
		v := math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		if add {
			dst[i] += v
		} else {
			dst[i] = v
		}
	}
}
