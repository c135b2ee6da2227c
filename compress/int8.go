package compress

import (
	"fmt"
	"math"
)

// Linear int8 ("int8"): per block one fp32 absmax then one int8 per value,
// q = round-to-nearest-even(127·x/absmax). A block holding NaN or ±Inf stores a
// NaN absmax and decodes to all NaN.
//
// Shared-scale int8 ("sint8"): the same layout for a single peer, stochastic
// rounding; inside a ring the absmax values are agreed (MAX all-reduce) and only
// the int8 codes travel, with L = floor(127/peers) levels so sums cannot overflow.

// roundMagic added to a float32 of magnitude < 2^22 leaves round-to-nearest-even
// of the value, as a two's complement integer, in the low mantissa bits.
const roundMagic = 12582912 // 1.5·2^23

// quantRNE writes round-to-nearest-even(levels·v/absmax) into out as int8 codes and
// returns the scale to store: absmax, or NaN when absmax is not finite.
func quantRNE(out []byte, v []float32, absmax, levels float32) float32 {
	out = out[:len(v)]
	if s, ok := degenerate(out, absmax); ok {
		return s
	}
	scale := levels / absmax
	if !isFinite(scale) { // absmax is tiny: keep precision in float64
		s := float64(levels) / float64(absmax)
		for i, x := range v {
			out[i] = byte(int8(math.RoundToEven(float64(x) * s)))
		}
		return absmax
	}
	i := 0
	for ; i+4 <= len(v); i += 4 {
		out[i] = byte(math.Float32bits(float32(v[i]*scale) + roundMagic))
		out[i+1] = byte(math.Float32bits(float32(v[i+1]*scale) + roundMagic))
		out[i+2] = byte(math.Float32bits(float32(v[i+2]*scale) + roundMagic))
		out[i+3] = byte(math.Float32bits(float32(v[i+3]*scale) + roundMagic))
	}
	for ; i < len(v); i++ {
		out[i] = byte(math.Float32bits(float32(v[i]*scale) + roundMagic))
	}
	return absmax
}

// quantStochastic writes floor(levels·v/absmax + u) clamped to ±levels into
// out, u being elements first, first+1, … of the 16-bit stream key (see
// uniform16; 16 bits bias a rounding by at most 2^-16 of a level). A zero or
// non-finite absmax writes zero codes.
func quantStochastic(out []byte, v []float32, key uint64, first int, absmax float32, levels int32) {
	out = out[:len(v)]
	if !isFinite(absmax) || absmax == 0 {
		clear(out)
		return
	}
	scale := float32(levels) / absmax
	if !isFinite(scale) { // absmax is tiny: scale in float64
		s := float64(levels) / float64(absmax)
		for i, x := range v {
			q := int32(math.Floor(float64(x)*s + float64(uniform16(key, first+i))))
			out[i] = byte(int8(min(max(q, -levels), levels)))
		}
		return
	}
	q := func(x, u float32) byte {
		y := int32(math.Floor(float64(float32(x*scale) + u)))
		return byte(int8(min(max(y, -levels), levels)))
	}
	i := 0
	for ; i < len(v) && (first+i)%4 != 0; i++ { // up to a group of four
		out[i] = q(v[i], uniform16(key, first+i))
	}
	const inv = 1.0 / (1 << 16)
	c := key + uint64((first+i)/4)*wyInc
	if n := (len(v) - i) &^ 7; useAVX2 && n > 0 {
		quantStochAVX2(&out[i], &v[i], n, c, scale, levels)
		i += n
		c += uint64(n/4) * wyInc
	}
	for ; i+4 <= len(v); i += 4 {
		r := wyrand(c)
		c += wyInc
		x := v[i : i+4 : i+4]
		o := out[i : i+4 : i+4]
		o[0] = q(x[0], float32(r&0xffff)*inv)
		o[1] = q(x[1], float32(r>>16&0xffff)*inv)
		o[2] = q(x[2], float32(r>>32&0xffff)*inv)
		o[3] = q(x[3], float32(r>>48)*inv)
	}
	for ; i < len(v); i++ {
		out[i] = q(v[i], uniform16(key, first+i))
	}
}

// dequant writes (or adds) code·absmax/levels for each int8 code. A NaN absmax
// gives NaN values; absmax must have been validated.
func dequant(dst []float32, codes []byte, absmax, levels float32, add bool) {
	codes = codes[:len(dst)]
	if isNaN(absmax) {
		for i := range dst {
			if add {
				dst[i] += canonicalNaN
			} else {
				dst[i] = canonicalNaN
			}
		}
		return
	}
	scale := levels / absmax
	if absmax == 0 || !isFinite(scale) {
		d := float64(absmax) / float64(levels)
		for i, c := range codes {
			v := float32(float64(int8(c)) * d)
			if add {
				dst[i] += v
			} else {
				dst[i] = v
			}
		}
		return
	}
	if levels == 127 {
		// A multiply is as exact as a divide by 127/absmax to within an ulp; use it where
		// no known answer pins the division.
		d := absmax / 127
		if add {
			for i, c := range codes {
				dst[i] += float32(int8(c)) * d
			}
		} else {
			for i, c := range codes {
				dst[i] = float32(int8(c)) * d
			}
		}
		return
	}
	if add {
		for i, c := range codes {
			dst[i] += float32(int8(c)) / scale
		}
	} else {
		for i, c := range codes {
			dst[i] = float32(int8(c)) / scale
		}
	}
}

// blockedLen is the payload size of n values in blocks with hdr header bytes
// each and bytesFor(k) bytes for the codes of k values.
func blockedLen(n, block, hdr int, bytesFor func(int) int) int {
	full := n / block
	l := full * (hdr + bytesFor(block))
	if r := n % block; r > 0 {
		l += hdr + bytesFor(r)
	}
	return l
}

func identity(n int) int { return n }

// byteCodec is a blocked codec with layout [absmax fp32][one byte per value]
// (int8, dyn8).
type byteCodec struct {
	base
	block int
	// enc writes a block's codes and returns the absmax to store.
	enc func(out []byte, v []float32) float32
	// dec writes or adds a block's values from its validated absmax.
	dec func(dst []float32, codes []byte, absmax float32, add bool)
}

func buildInt8(p params, opts Options) (Codec, error) {
	return &byteCodec{newBase(p.canonical(), ClassQuantized, opts.Layout.Len()), p.int("block"),
		func(out []byte, v []float32) float32 { return quantRNE(out, v, absMax(v), 127) },
		dequant127}, nil
}

func (c *byteCodec) MaxEncodedLen(n int) int { return blockedLen(n, c.block, 4, identity) }
func (c *byteCodec) Reset()                  {}

func (c *byteCodec) Encode(dst []byte, src []float32, pos Pos) ([]byte, error) {
	if err := checkRegion(c.name, pos, len(src), c.total); err != nil {
		return dst, err
	}
	dst, out := grow(dst, c.MaxEncodedLen(len(src)))
	for b := 0; b < len(src); b += c.block {
		v := src[b:min(b+c.block, len(src))]
		putF32(out, c.enc(out[4:4+len(v)], v))
		out = out[4+len(v):]
	}
	return dst, nil
}

func (c *byteCodec) Decode(dst []float32, src []byte) error {
	return decodeScaledBlocks(c.name, dst, src, c.block, c.dec, false)
}

func (c *byteCodec) DecodeAdd(dst []float32, src []byte) error {
	return decodeScaledBlocks(c.name, dst, src, c.block, c.dec, true)
}

// decodeScaledBlocks decodes the [absmax][byte codes] block layout with dec.
func decodeScaledBlocks(name string, dst []float32, src []byte, block int,
	dec func(dst []float32, codes []byte, absmax float32, add bool), add bool) error {
	if err := checkLen(name, len(src), blockedLen(len(dst), block, 4, identity), len(dst)); err != nil {
		return err
	}
	for b := 0; b < len(dst); b += block {
		d := dst[b:min(b+block, len(dst))]
		m := getF32(src)
		if !validScale(m) {
			return corruptf(name, "block %d has absmax %g", b/block, m)
		}
		dec(d, src[4:4+len(d)], m, add)
		src = src[4+len(d):]
	}
	return nil
}

// sint8Codec is the shared-scale int8 codec; it implements SharedScaler.
type sint8Codec struct {
	base
	block int
	seed  uint64
}

var _ SharedScaler = (*sint8Codec)(nil)

func buildSInt8(p params, opts Options) (Codec, error) {
	b := p.int("block")
	return &sint8Codec{
		base:  newBase(p.canonical(), ClassSharedScale, opts.Layout.Len()),
		block: b, seed: opts.Seed,
	}, nil
}

func (c *sint8Codec) MaxEncodedLen(n int) int { return blockedLen(n, c.block, 4, identity) }
func (c *sint8Codec) Reset()                  {}

// Block is the number of values that share one scale.
func (c *sint8Codec) Block() int { return c.block }

// NumScales returns how many scales n values need.
func (c *sint8Codec) NumScales(n int) int { return numBlocks(n, c.block) }

// Scales writes the per-block absmax of src into dst[:NumScales(len(src))]:
// NaN for a block holding a NaN, else +Inf for one holding an infinity.
func (c *sint8Codec) Scales(dst, src []float32) {
	for b := 0; b < len(src); b += c.block {
		dst[b/c.block] = absMax(src[b:min(b+c.block, len(src))])
	}
}

// levelsFor returns L = floor(127/peers).
func levelsFor(peers int) (int32, error) {
	if peers < 1 || peers > 127 {
		return 0, fmt.Errorf("compress: sint8 supports 1 to 127 peers, got %d: %w", peers, ErrShape)
	}
	return int32(127 / peers), nil
}

// Encode is the single-peer form: per block the local absmax, then codes with
// stochastic rounding to ±127 levels.
func (c *sint8Codec) Encode(dst []byte, src []float32, pos Pos) ([]byte, error) {
	if err := checkRegion("compress: sint8", pos, len(src), c.total); err != nil {
		return dst, err
	}
	dst, out := grow(dst, c.MaxEncodedLen(len(src)))
	key := streamKey(c.seed, pos)
	for b := 0; b < len(src); b += c.block {
		v := src[b:min(b+c.block, len(src))]
		m := absMax(v)
		if !isFinite(m) {
			m = canonicalNaN
		}
		putF32(out, m)
		quantStochastic(out[4:], v, key, b, m, 127)
		out = out[4+len(v):]
	}
	return dst, nil
}

// EncodeScaled appends one int8 code per value: floor(L·x/absmax + u) with
// L = floor(127/peers), u uniform from (Seed, pos), clamped to ±L. Block i of
// src uses absmax[i]. Only the codes travel (the scales are agreed separately).
func (c *sint8Codec) EncodeScaled(dst []byte, src, absmax []float32, peers int, pos Pos) ([]byte, error) {
	if err := checkRegion("compress: sint8", pos, len(src), c.total); err != nil {
		return dst, err
	}
	if len(absmax) != c.NumScales(len(src)) {
		return dst, fmt.Errorf("compress: sint8: %d scales for %d values, want %d: %w",
			len(absmax), len(src), c.NumScales(len(src)), ErrShape)
	}
	levels, err := levelsFor(peers)
	if err != nil {
		return dst, err
	}
	dst, out := grow(dst, len(src))
	key := streamKey(c.seed, pos)
	for b := 0; b < len(src); b += c.block {
		v := src[b:min(b+c.block, len(src))]
		quantStochastic(out[b:], v, key, b, absmax[b/c.block], levels)
	}
	return dst, nil
}

// AddEncoded adds payload b into payload a in the integer domain. A sum outside
// ±127 means the payloads were not encoded for this ring size: ErrCorrupt.
func (c *sint8Codec) AddEncoded(a, b []byte) error {
	if len(a) != len(b) {
		return corruptf("compress: sint8", "adding payloads of %d and %d bytes", len(a), len(b))
	}
	b = b[:len(a)]
	for i := range a {
		s := int32(int8(a[i])) + int32(int8(b[i]))
		if s > 127 || s < -127 {
			return corruptf("compress: sint8", "integer sum %d at %d overflows", s, i)
		}
		a[i] = byte(int8(s))
	}
	return nil
}

// DecodeScaled writes sum·absmax/L for the (summed) codes in src; a NaN or
// infinite absmax gives NaN for its block.
func (c *sint8Codec) DecodeScaled(dst []float32, src []byte, absmax []float32, peers int) error {
	if err := checkLen("compress: sint8", len(src), len(dst), len(dst)); err != nil {
		return err
	}
	if len(absmax) != c.NumScales(len(dst)) {
		return fmt.Errorf("compress: sint8: %d scales for %d values, want %d: %w",
			len(absmax), len(dst), c.NumScales(len(dst)), ErrShape)
	}
	levels, err := levelsFor(peers)
	if err != nil {
		return err
	}
	for b := 0; b < len(dst); b += c.block {
		m := absmax[b/c.block]
		if !isFinite(m) {
			m = canonicalNaN
		}
		if !validScale(m) {
			return fmt.Errorf("compress: sint8: negative absmax %g: %w", m, ErrShape)
		}
		dequant(dst[b:min(b+c.block, len(dst))], src[b:], m, float32(levels), false)
	}
	return nil
}

func (c *sint8Codec) Decode(dst []float32, src []byte) error {
	return decodeScaledBlocks("compress: sint8", dst, src, c.block, dequant127, false)
}

func (c *sint8Codec) DecodeAdd(dst []float32, src []byte) error {
	return decodeScaledBlocks("compress: sint8", dst, src, c.block, dequant127, true)
}

func dequant127(dst []float32, codes []byte, absmax float32, add bool) {
	dequant(dst, codes, absmax, 127, add)
}
