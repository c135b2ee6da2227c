package compress

import "math"

// Error-feedback 1-bit codecs. Both send one bit per value, (a >= 0), after
// adding the region's residual when Pos.Feedback is set, and then keep
// residual = a − reconstruction.
//
// onebit (1-bit SGD, CNTK style): per block [mean of entries with bit 1 (fp32)]
// [mean of entries with bit 0 (fp32)][bits]; each bit decodes to its group's mean.
//
// sign (EF-SignSGD): per block [‖a‖₁/len (fp32)][bits]; a bit decodes to ±scale
// (sign(0) = +1).
//
// Bits are packed little-endian within bytes; the unused bits of a block's last
// byte must be zero. A block whose input holds NaN or ±Inf stores NaN header
// values (decoding to NaN) and its residual is reset to zero, so the poison does
// not outlive the step.

// efCodec holds what onebit and sign share.
type efCodec struct {
	base
	block int
	hdr   int // header bytes per block
	res   residual
}

func (c *efCodec) MaxEncodedLen(n int) int { return blockedLen(n, c.block, c.hdr, bitBytes) }

// Reset zeroes the error-feedback residuals.
func (c *efCodec) Reset() { c.res.Reset() }

func bitBytes(n int) int { return (n + 7) / 8 }

// encode runs the shared encode loop; header adds the gradient g into the
// residual r when r is not nil (a = r, else a = g), writes the block's header
// and returns the reconstruction of bit 0 and bit 1 (NaN for non-finite input).
func (c *efCodec) encode(dst []byte, src []float32, pos Pos, name string,
	header func(out []byte, g, r []float32) (vals [2]float32)) ([]byte, error) {
	if err := checkRegion(name, pos, len(src), c.total); err != nil {
		return dst, err
	}
	dst, out := grow(dst, c.MaxEncodedLen(len(src)))
	var res []float32
	if pos.Feedback {
		res = c.res.region(pos, len(src))
	}
	for b := 0; b < len(src); b += c.block {
		a := src[b:min(b+c.block, len(src))]
		var r []float32
		if res != nil {
			r = res[b : b+len(a)]
		}
		vals := header(out, a, r)
		if r != nil {
			a = r
		}
		bits := out[c.hdr : c.hdr+bitBytes(len(a))]
		if isNaN(vals[0]) || isNaN(vals[1]) {
			clear(bits)
			clear(r)
		} else {
			if r != nil {
				packSignsRecon(bits, a, r, vals)
			} else {
				packSigns(bits, a)
			}
		}
		out = out[c.hdr+len(bits):]
	}
	return dst, nil
}

// addInto adds a into r.
func addInto(r, a []float32) {
	a = a[:len(r)]
	for i := range r {
		r[i] += a[i]
	}
}

// signBit returns 1 if x >= 0 (−0 included), else 0, without a branch: adding
// +0 turns −0 into +0. (NaN gives its sign bit's complement; NaN blocks are
// cleared anyway.)
func signBit(x float32) uint32 { return ^math.Float32bits(x+0) >> 31 }

// packSigns writes bit i = (a[i] >= 0).
func packSigns(out []byte, a []float32) {
	out = out[:bitBytes(len(a))]
	full := len(a) / 8
	for j := range full {
		g := (*[8]float32)(a[8*j:])
		out[j] = byte(signBit(g[0]) | signBit(g[1])<<1 | signBit(g[2])<<2 | signBit(g[3])<<3 |
			signBit(g[4])<<4 | signBit(g[5])<<5 | signBit(g[6])<<6 | signBit(g[7])<<7)
	}
	if full < len(out) {
		var b uint32
		for k, x := range a[8*full:] {
			b |= signBit(x) << k
		}
		out[full] = byte(b)
	}
}

// signRecon returns x's bit and stores x − (pos or neg, by the bit) in *r;
// neg and pos are given as bits, and diff = pos^neg, for a branch-free select.
func signRecon(x float32, r *float32, neg, diff uint32) uint32 {
	s := signBit(x)
	*r = x - math.Float32frombits(neg^diff&-s)
	return s
}

// packSignsRecon writes bit i = (a[i] >= 0) and sets r[i] = a[i] − vals[bit]
// (r may be a itself).
func packSignsRecon(out []byte, a, r []float32, vals [2]float32) {
	out = out[:bitBytes(len(a))]
	r = r[:len(a)]
	neg := math.Float32bits(vals[0])
	diff := math.Float32bits(vals[1]) ^ neg
	full := len(a) / 8
	j0 := 0
	if useAVX2 && full > 0 {
		packReconAVX2(&out[0], &a[0], &r[0], 8*full, vals[0], vals[1])
		j0 = full
	}
	for j := j0; j < full; j++ {
		g, q := (*[8]float32)(a[8*j:]), (*[8]float32)(r[8*j:])
		out[j] = byte(signRecon(g[0], &q[0], neg, diff) | signRecon(g[1], &q[1], neg, diff)<<1 |
			signRecon(g[2], &q[2], neg, diff)<<2 | signRecon(g[3], &q[3], neg, diff)<<3 |
			signRecon(g[4], &q[4], neg, diff)<<4 | signRecon(g[5], &q[5], neg, diff)<<5 |
			signRecon(g[6], &q[6], neg, diff)<<6 | signRecon(g[7], &q[7], neg, diff)<<7)
	}
	if full < len(out) {
		var b uint32
		for k, x := range a[8*full:] {
			b |= signRecon(x, &r[8*full+k], neg, diff) << k
		}
		out[full] = byte(b)
	}
}

// unpackBits writes or adds vals[bit] for each bit, after checking the padding.
func unpackBits(d []float32, bits []byte, vals [2]float32, add bool) bool {
	bits = bits[:bitBytes(len(d))]
	if r := len(d) % 8; r != 0 && bits[len(bits)-1]>>r != 0 {
		return false
	}
	full := len(d) / 8
	j0 := 0
	if useAVX2 && full > 0 {
		unpackBitsAVX2(&d[0], &bits[0], 8*full, vals[0], vals[1], add)
		j0 = full
	}
	for j := j0; j < full; j++ {
		x := bits[j]
		e := d[8*j : 8*j+8]
		if add {
			for k := range e {
				e[k] += vals[x>>k&1]
			}
		} else {
			for k := range e {
				e[k] = vals[x>>k&1]
			}
		}
	}
	for i := full * 8; i < len(d); i++ {
		v := vals[bits[full]>>(i&7)&1]
		if add {
			d[i] += v
		} else {
			d[i] = v
		}
	}
	return true
}

// decodeBits checks a payload of bit blocks and writes or adds its values;
// vals returns a block's reconstruction values from its header, or ok=false.
func (c *efCodec) decodeBits(dst []float32, src []byte, add bool, name string,
	vals func(hdr []byte) ([2]float32, bool)) error {
	if err := checkLen(name, len(src), c.MaxEncodedLen(len(dst)), len(dst)); err != nil {
		return err
	}
	for b := 0; b < len(dst); b += c.block {
		d := dst[b:min(b+c.block, len(dst))]
		v, ok := vals(src[:c.hdr])
		if !ok {
			return corruptf(name, "block %d has a bad header %x", b/c.block, src[:c.hdr])
		}
		if !unpackBits(d, src[c.hdr:], v, add) {
			return corruptf(name, "block %d has non-zero padding bits", b/c.block)
		}
		src = src[c.hdr+bitBytes(len(d)):]
	}
	return nil
}

type oneBitCodec struct{ efCodec }

func buildOneBit(p params, opts Options) (Codec, error) {
	n := opts.Layout.Len()
	return &oneBitCodec{efCodec{newBase(p.canonical(), ClassErrorFeedback, n), p.int("block"), 8, residual{n: n}}}, nil
}

func (c *oneBitCodec) Encode(dst []byte, src []float32, pos Pos) ([]byte, error) {
	return c.encode(dst, src, pos, "compress: onebit", oneBitHeader)
}

// oneBitHeader writes the two group means of a = g (+ r, stored into r).
func oneBitHeader(out []byte, a, r []float32) [2]float32 {
	if r != nil {
		r = r[:len(a)]
	}
	// Eight interleaved accumulators per sum (value i into i mod 8), so
	// that the AVX2 kernel's four add chains run side by side; combined in
	// a fixed order.
	var acc [16]float64 // all[0:8], pos[8:16]
	var cnt uint32
	i := 0
	if n := len(a) &^ 7; useAVX2 && n > 0 {
		var rp *float32
		if r != nil {
			rp = &r[0]
		}
		cnt = uint32(oneBitStatsAVX2(&a[0], rp, n, &acc))
		i = n
	}
	for ; i < len(a); i++ {
		x := a[i]
		if r != nil {
			x += r[i]
			r[i] = x
		}
		sx := signBit(x)
		cnt += sx
		acc[i%8] += float64(x)
		acc[8+i%8] += float64(math.Float32frombits(math.Float32bits(x+0) & -sx))
	}
	var sumAll, sumPos float64
	for k := range 8 {
		sumAll += acc[k]
		sumPos += acc[8+k]
	}
	var pos, neg float32
	if cnt > 0 {
		pos = float32(sumPos / float64(cnt))
	}
	if int(cnt) < len(a) {
		neg = float32((sumAll - sumPos) / float64(len(a)-int(cnt)))
	}
	if !isFinite(pos) || !isFinite(neg) {
		pos, neg = canonicalNaN, canonicalNaN
	}
	putF32(out, pos)
	putF32(out[4:], neg)
	return [2]float32{neg, pos}
}

func (c *oneBitCodec) Decode(dst []float32, src []byte) error { return c.decode(dst, src, false) }

func (c *oneBitCodec) DecodeAdd(dst []float32, src []byte) error { return c.decode(dst, src, true) }

func (c *oneBitCodec) decode(dst []float32, src []byte, add bool) error {
	return c.decodeBits(dst, src, add, "compress: onebit", func(h []byte) ([2]float32, bool) {
		pos, neg := getF32(h), getF32(h[4:])
		return [2]float32{neg, pos}, validScale(pos) && validScale(-neg)
	})
}

type signCodec struct{ efCodec }

func buildSign(p params, opts Options) (Codec, error) {
	n := opts.Layout.Len()
	return &signCodec{efCodec{newBase(p.canonical(), ClassErrorFeedback, n), p.int("block"), 4, residual{n: n}}}, nil
}

func (c *signCodec) Encode(dst []byte, src []float32, pos Pos) ([]byte, error) {
	return c.encode(dst, src, pos, "compress: sign", signHeader)
}

// signHeader writes ‖a‖₁/len(a) of a = g (+ r, stored into r).
func signHeader(out []byte, a, r []float32) [2]float32 {
	s := float32(sumAbs(a, r) / float64(len(a)))
	if !isFinite(s) {
		s = canonicalNaN
	}
	putF32(out, s)
	return [2]float32{-s, s}
}

func (c *signCodec) Decode(dst []float32, src []byte) error { return c.decode(dst, src, false) }

func (c *signCodec) DecodeAdd(dst []float32, src []byte) error { return c.decode(dst, src, true) }

func (c *signCodec) decode(dst []float32, src []byte, add bool) error {
	return c.decodeBits(dst, src, add, "compress: sign", func(h []byte) ([2]float32, bool) {
		s := getF32(h)
		return [2]float32{-s, s}, validScale(s)
	})
}
