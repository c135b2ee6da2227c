package compress

import (
	"encoding/binary"
	"math"
	"slices"
)

// Top-k with error feedback ("topk:ratio=r[,dgc=true,momentum=m]"). With
// Pos.Feedback, a = g + e (or with DGC: u ← m·u + g, v ← v + u, a = v); the
// k = ceil(r·n) entries of largest |a| are sent, ties to the lower index, and
// their residual (and DGC momentum) entries are zeroed; the rest stay in the
// residual. Payload: k (uint32), then k strictly increasing indices (uint32,
// relative to the encoded slice), then k fp32 values. Decode scatters the values
// (Decode zeroes dst first); dividing by the number of peers is the caller's job.
//
// NaN and ±Inf rank above every finite magnitude (NaN above Inf), so non-finite
// entries are sent first and leave the residual.

type topKCodec struct {
	base
	ratio    float64
	dgc      bool
	momentum float32
	res, mom residual
	hist     []uint32 // radix-select scratch, 1<<16 counters
	keys     []uint32 // small-input selection scratch
}

func buildTopK(p params, opts Options) (Codec, error) {
	n := opts.Layout.Len()
	return &topKCodec{
		base:  newBase(p.canonical(), ClassSparse, n),
		ratio: p.float("ratio"), dgc: p.bool("dgc"), momentum: float32(p.float("momentum")),
		res: residual{n: n}, mom: residual{n: n},
	}, nil
}

// k returns how many of n values are sent.
func (c *topKCodec) k(n int) int {
	if n == 0 {
		return 0
	}
	k := int(math.Ceil(c.ratio*float64(n) - 1e-9))
	return min(max(k, 1), n)
}

func (c *topKCodec) MaxEncodedLen(n int) int { return 4 + 8*c.k(n) }

// Reset zeroes the residuals and the DGC momentum.
func (c *topKCodec) Reset() {
	c.res.Reset()
	c.mom.Reset()
}

func (c *topKCodec) Encode(dst []byte, src []float32, pos Pos) ([]byte, error) {
	if err := checkRegion("compress: topk", pos, len(src), c.total); err != nil {
		return dst, err
	}
	n, k := len(src), c.k(len(src))
	dst, out := grow(dst, 4+8*k)
	binary.LittleEndian.PutUint32(out, uint32(k))
	if k == 0 {
		return dst, nil
	}
	a := src
	var r, u []float32
	if pos.Feedback {
		r = c.res.region(pos, n)
		if c.dgc {
			u = c.mom.region(pos, n)
			m := c.momentum
			for i, g := range src {
				u[i] = float32(m*u[i]) + g
				r[i] += u[i]
			}
		} else {
			addInto(r, src)
		}
		a = r
	}
	t, above := c.threshold(a, k)
	idx, val := out[4:4+4*k], out[4+4*k:4+8*k]
	ties := k - above
	j := 0
	for i, x := range a {
		b := absBits(x)
		if b < t {
			continue
		}
		if b == t {
			if ties == 0 {
				continue
			}
			ties--
		}
		binary.LittleEndian.PutUint32(idx[4*j:], uint32(i))
		binary.LittleEndian.PutUint32(val[4*j:], math.Float32bits(x))
		j++
		if r != nil {
			r[i] = 0
			if u != nil {
				u[i] = 0
			}
		}
	}
	return dst, nil
}

// threshold returns the absBits key t of the k-th largest |a| (1 <= k <= len(a))
// and how many entries have a key above t.
func (c *topKCodec) threshold(a []float32, k int) (t uint32, above int) {
	if len(a) <= 2048 {
		keys := c.keys[:0]
		for _, x := range a {
			keys = append(keys, absBits(x))
		}
		c.keys = keys
		slices.Sort(keys)
		t = keys[len(keys)-k]
		for i := len(keys) - 1; i >= 0 && keys[i] > t; i-- {
			above++
		}
		return t, above
	}
	if c.hist == nil {
		c.hist = make([]uint32, 1<<16)
	}
	h := c.hist[:1<<16]
	clear(h[:1<<15])
	for _, x := range a {
		h[absBits(x)>>16]++
	}
	hi := 1<<15 - 1
	for ; above+int(h[hi]) < k; hi-- {
		above += int(h[hi])
	}
	clear(h)
	for _, x := range a {
		if b := absBits(x); int(b>>16) == hi {
			h[b&0xffff]++
		}
	}
	lo := 1<<16 - 1
	for ; above+int(h[lo]) < k; lo-- {
		above += int(h[lo])
	}
	return uint32(hi)<<16 | uint32(lo), above
}

func (c *topKCodec) Decode(dst []float32, src []byte) error { return c.decode(dst, src, false) }

func (c *topKCodec) DecodeAdd(dst []float32, src []byte) error { return c.decode(dst, src, true) }

func (c *topKCodec) decode(dst []float32, src []byte, add bool) error {
	const name = "compress: topk"
	if len(src) < 4 {
		return corruptf(name, "payload of %d bytes has no header", len(src))
	}
	k := c.k(len(dst))
	if got := binary.LittleEndian.Uint32(src); uint64(got) != uint64(k) {
		return corruptf(name, "%d entries for %d values, want %d", got, len(dst), k)
	}
	if err := checkLen(name, len(src), 4+8*k, len(dst)); err != nil {
		return err
	}
	idx, val := src[4:4+4*k], src[4+4*k:]
	next := uint64(0)
	for j := range k {
		i := uint64(binary.LittleEndian.Uint32(idx[4*j:]))
		if i < next || i >= uint64(len(dst)) {
			return corruptf(name, "entry %d has index %d (want increasing, below %d)", j, i, len(dst))
		}
		next = i + 1
	}
	if !add {
		clear(dst)
	}
	for j := range k {
		i := binary.LittleEndian.Uint32(idx[4*j:])
		if add {
			dst[i] += getF32(val[4*j:])
		} else {
			dst[i] = getF32(val[4*j:])
		}
	}
	return nil
}
