package compress

import "math"

// QSGD ("qsgd:bits=b,block=d,norm=l2|linf"): per block one fp32 norm n, then
// b bits per value packed little-endian in bytes: the level l in 0…s (s = 2^(b−1)−1)
// in the low b−1 bits and the sign above. With a = s·|v|/n, l = floor(a) + 1 iff
// u < a − floor(a), u uniform in [0, 1) from the stream of (Seed, Step, Stream,
// Offset); decoding gives n·sign·l/s, an unbiased estimate. Each block's codes
// start on a byte boundary; unused bits of its last byte must be zero.
// A block holding NaN or ±Inf (or whose ℓ2 norm overflows fp32) stores a NaN norm
// and decodes to NaN.

type qsgdCodec struct {
	base
	bits, block int
	levels      int32
	linf        bool
	seed        uint64
	u, scaled   []float32 // scratch, one block each
	// signed[c] is the signed level of code c.
	signed [256]float32
}

func buildQSGD(p params, opts Options) (Codec, error) {
	bits, block := p.int("bits"), p.int("block")
	sz := min(block, max(opts.Layout.Len(), 1))
	c := &qsgdCodec{
		base: newBase(p.canonical(), ClassQuantized, opts.Layout.Len()),
		bits: bits, block: block, levels: int32(1)<<(bits-1) - 1,
		linf: p.vals["norm"] == "linf", seed: opts.Seed,
		u: make([]float32, sz), scaled: make([]float32, sz),
	}
	for code := range 1 << bits {
		l := float32(code & (1<<(bits-1) - 1))
		if code>>(bits-1) != 0 {
			l = -l
		}
		c.signed[code] = l
	}
	return c, nil
}

func (c *qsgdCodec) packedLen(n int) int { return (n*c.bits + 7) / 8 }

func (c *qsgdCodec) MaxEncodedLen(n int) int { return blockedLen(n, c.block, 4, c.packedLen) }
func (c *qsgdCodec) Reset()                  {}

// norm returns the block norm of v.
func (c *qsgdCodec) norm(v []float32) float32 {
	if c.linf {
		return absMax(v)
	}
	return float32(math.Sqrt(sumSq(v)))
}

func (c *qsgdCodec) Encode(dst []byte, src []float32, pos Pos) ([]byte, error) {
	if err := checkRegion("compress: qsgd", pos, len(src), c.total); err != nil {
		return dst, err
	}
	dst, out := grow(dst, c.MaxEncodedLen(len(src)))
	key := streamKey(c.seed, pos)
	for b := 0; b < len(src); b += c.block {
		v := src[b:min(b+c.block, len(src))]
		u := c.u[:len(v)]
		fillUniform(u, key, b)
		out = c.encodeBlock(out, v, u)
	}
	return dst, nil
}

// encodeBlock writes one block (norm + packed codes) using the uniforms u and
// returns the rest of out.
func (c *qsgdCodec) encodeBlock(out []byte, v, u []float32) []byte {
	n := c.norm(v)
	pl := c.packedLen(len(v))
	codes := out[4 : 4+pl]
	if !isFinite(n) || n == 0 {
		if n != 0 {
			n = canonicalNaN
		}
		putF32(out, n)
		clear(codes)
		return out[4+pl:]
	}
	putF32(out, n)
	scale := float32(c.levels) / n
	x := v
	if !isFinite(scale) { // n is tiny: scale in float64
		x = c.scaled[:len(v)]
		s := float64(c.levels) / float64(n)
		for i, y := range v {
			x[i] = float32(float64(y) * s)
		}
		scale = 1
	}
	qsgdPack(codes, x, u, scale, c.levels, c.bits)
	return out[4+pl:]
}

// qsgdCode returns the code (sign<<(bits−1) | level) of x: with a = |x|·scale,
// level = floor(a) + 1 iff u < a − floor(a), at most s; sh = bits − 1.
func qsgdCode(x, u, scale float32, s int32, sh uint) uint32 {
	xb := math.Float32bits(x)
	a := float32(math.Float32frombits(xb&0x7fffffff) * scale)
	l := int32(a)
	if u < a-float32(l) {
		l++
	}
	return uint32(min(l, s)) | xb>>31<<(sh&31)
}

// qsgdPack writes the codes of v (uniforms u) packed little-endian, bits per code.
func qsgdPack(out []byte, v, u []float32, scale float32, s int32, bits int) {
	u = u[:len(v)]
	sh := uint(bits - 1)
	i := 0
	switch bits {
	case 8:
		out = out[:len(v)]
		for i = range v {
			out[i] = byte(qsgdCode(v[i], u[i], scale, s, sh))
		}
		return
	case 4:
		if n := len(v) &^ 7; useAVX2 && n > 0 {
			qsgdPack4AVX2(&out[0], &v[0], &u[0], n, scale, s)
			i = n
		}
		for ; i+2 <= len(v); i += 2 {
			out[i/2] = byte(qsgdCode(v[i], u[i], scale, s, sh) | qsgdCode(v[i+1], u[i+1], scale, s, sh)<<4)
		}
	case 2:
		for ; i+4 <= len(v); i += 4 {
			x, w := v[i:i+4:i+4], u[i:i+4:i+4]
			out[i/4] = byte(qsgdCode(x[0], w[0], scale, s, sh) | qsgdCode(x[1], w[1], scale, s, sh)<<2 |
				qsgdCode(x[2], w[2], scale, s, sh)<<4 | qsgdCode(x[3], w[3], scale, s, sh)<<6)
		}
	}
	if i < len(v) { // the last, partial byte
		per := 8 / bits
		var b uint32
		for j := i; j < len(v); j++ {
			b |= qsgdCode(v[j], u[j], scale, s, sh) << (bits * (j - i) & 31)
		}
		out[i/per] = byte(b)
	}
}

func (c *qsgdCodec) Decode(dst []float32, src []byte) error { return c.decode(dst, src, false) }

func (c *qsgdCodec) DecodeAdd(dst []float32, src []byte) error { return c.decode(dst, src, true) }

func (c *qsgdCodec) decode(dst []float32, src []byte, add bool) error {
	const name = "compress: qsgd"
	if err := checkLen(name, len(src), c.MaxEncodedLen(len(dst)), len(dst)); err != nil {
		return err
	}
	for b := 0; b < len(dst); b += c.block {
		d := dst[b:min(b+c.block, len(dst))]
		n := getF32(src)
		if !validScale(n) {
			return corruptf(name, "block %d has norm %g", b/c.block, n)
		}
		pl := c.packedLen(len(d))
		codes := src[4 : 4+pl]
		if pad := len(d) * c.bits % 8; pad != 0 && codes[pl-1]>>pad != 0 {
			return corruptf(name, "block %d has non-zero padding bits", b/c.block)
		}
		c.decodeBlock(d, codes, n/float32(c.levels), add)
		src = src[4+pl:]
	}
	return nil
}

// decodeBlock writes or adds signed[code]·scale for each packed code.
func (c *qsgdCodec) decodeBlock(d []float32, codes []byte, scale float32, add bool) {
	t := &c.signed
	per := 8 / c.bits
	mask := byte(1)<<c.bits - 1
	full := len(d) / per
	if n := len(d) &^ 7; c.bits == 4 && useAVX2 && n > 0 {
		qsgdDecode4AVX2(&d[0], &codes[0], n, scale, add)
		d, codes, full = d[n:], codes[n/2:], full-n/2
	}
	switch {
	case c.bits == 8 && add:
		for i, x := range codes[:len(d)] {
			d[i] += t[x] * scale
		}
	case c.bits == 8:
		for i, x := range codes[:len(d)] {
			d[i] = t[x] * scale
		}
	case c.bits == 4 && add:
		for j, x := range codes[:full] {
			d[2*j] += t[x&15] * scale
			d[2*j+1] += t[x>>4] * scale
		}
	case c.bits == 4:
		for j, x := range codes[:full] {
			d[2*j] = t[x&15] * scale
			d[2*j+1] = t[x>>4] * scale
		}
	default:
		for j, x := range codes[:full] {
			e := d[4*j : 4*j+4]
			if add {
				e[0] += t[x&3] * scale
				e[1] += t[x>>2&3] * scale
				e[2] += t[x>>4&3] * scale
				e[3] += t[x>>6] * scale
			} else {
				e[0] = t[x&3] * scale
				e[1] = t[x>>2&3] * scale
				e[2] = t[x>>4&3] * scale
				e[3] = t[x>>6] * scale
			}
		}
	}
	for i := full * per; i < len(d); i++ {
		k := i - full*per
		v := t[codes[full]>>(c.bits*k)&mask] * scale
		if add {
			d[i] += v
		} else {
			d[i] = v
		}
	}
}
