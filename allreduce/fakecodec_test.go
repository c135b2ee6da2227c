package allreduce_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"

	"github.com/p2ptrain/p2ptrain/compress"
)

// Small codecs implementing compress.Codec, one per class, so the schedules
// can be tested without the real codecs.

func putF(dst []byte, f float32) []byte {
	return binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
}
func getF(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }

func errLen(got, want int) error {
	return fmt.Errorf("%w: %d bytes, want %d", compress.ErrCorrupt, got, want)
}

// fakeFP32 is a lossless passthrough (ClassLinear).
type fakeFP32 struct{}

func (fakeFP32) Spec() string            { return "fake-fp32" }
func (fakeFP32) Class() compress.Class   { return compress.ClassLinear }
func (fakeFP32) MaxEncodedLen(n int) int { return 4 * n }
func (fakeFP32) Reset()                  {}
func (fakeFP32) Encode(dst []byte, src []float32, _ compress.Pos) ([]byte, error) {
	for _, v := range src {
		dst = putF(dst, v)
	}
	return dst, nil
}
func (fakeFP32) Decode(dst []float32, src []byte) error {
	if len(src) != 4*len(dst) {
		return errLen(len(src), 4*len(dst))
	}
	for i := range dst {
		dst[i] = getF(src[4*i:])
	}
	return nil
}
func (c fakeFP32) DecodeAdd(dst []float32, src []byte) error {
	if len(src) != 4*len(dst) {
		return errLen(len(src), 4*len(dst))
	}
	for i := range dst {
		dst[i] += getF(src[4*i:])
	}
	return nil
}

// fakeQ8 is a per-slice absmax int8 quantizer (ClassQuantized).
type fakeQ8 struct{}

func (fakeQ8) Spec() string            { return "fake-q8" }
func (fakeQ8) Class() compress.Class   { return compress.ClassQuantized }
func (fakeQ8) MaxEncodedLen(n int) int { return 4 + n }
func (fakeQ8) Reset()                  {}
func (fakeQ8) Encode(dst []byte, src []float32, _ compress.Pos) ([]byte, error) {
	var m float32
	for _, v := range src {
		m = max(m, float32(math.Abs(float64(v))))
	}
	dst = putF(dst, m)
	for _, v := range src {
		q := 0.0
		if m > 0 {
			q = math.Round(float64(127 * v / m))
		}
		dst = append(dst, byte(int8(q)))
	}
	return dst, nil
}
func (c fakeQ8) decode(dst []float32, src []byte, add bool) error {
	if len(src) != 4+len(dst) {
		return errLen(len(src), 4+len(dst))
	}
	m := getF(src)
	if m < 0 || m != m {
		return fmt.Errorf("%w: scale %v", compress.ErrCorrupt, m)
	}
	for i := range dst {
		v := float32(int8(src[4+i])) * m / 127
		if add {
			dst[i] += v
		} else {
			dst[i] = v
		}
	}
	return nil
}
func (c fakeQ8) Decode(dst []float32, src []byte) error    { return c.decode(dst, src, false) }
func (c fakeQ8) DecodeAdd(dst []float32, src []byte) error { return c.decode(dst, src, true) }

// fakeSign is EF-sign with per-offset residuals (ClassErrorFeedback).
type fakeSign struct {
	n   int
	res []float32
}

func newFakeSign(n int) *fakeSign         { return &fakeSign{n: n, res: make([]float32, n)} }
func (*fakeSign) Spec() string            { return "fake-sign" }
func (*fakeSign) Class() compress.Class   { return compress.ClassErrorFeedback }
func (*fakeSign) MaxEncodedLen(n int) int { return 4 + (n+7)/8 }
func (c *fakeSign) Reset()                { clear(c.res) }
func (c *fakeSign) Encode(dst []byte, src []float32, pos compress.Pos) ([]byte, error) {
	if pos.Offset < 0 || pos.Offset+len(src) > c.n {
		return dst, compress.ErrShape
	}
	p := make([]float32, len(src))
	copy(p, src)
	if pos.Feedback {
		for i := range p {
			p[i] += c.res[pos.Offset+i]
		}
	}
	var l1 float64
	for _, v := range p {
		l1 += math.Abs(float64(v))
	}
	scale := float32(0)
	if len(p) > 0 {
		scale = float32(l1 / float64(len(p)))
	}
	dst = putF(dst, scale)
	bits := make([]byte, (len(p)+7)/8)
	for i, v := range p {
		d := scale
		if v < 0 {
			d = -scale
			bits[i/8] |= 1 << (i % 8)
		}
		if pos.Feedback {
			c.res[pos.Offset+i] = v - d
		}
	}
	return append(dst, bits...), nil
}
func (c *fakeSign) decode(dst []float32, src []byte, add bool) error {
	if len(src) != 4+(len(dst)+7)/8 {
		return errLen(len(src), 4+(len(dst)+7)/8)
	}
	s := getF(src)
	for i := range dst {
		v := s
		if src[4+i/8]&(1<<(i%8)) != 0 {
			v = -s
		}
		if add {
			dst[i] += v
		} else {
			dst[i] = v
		}
	}
	return nil
}
func (c *fakeSign) Decode(dst []float32, src []byte) error    { return c.decode(dst, src, false) }
func (c *fakeSign) DecodeAdd(dst []float32, src []byte) error { return c.decode(dst, src, true) }

// fakeTopK keeps the k = ceil(ratio·n) largest entries with residuals (ClassSparse).
type fakeTopK struct {
	n     int
	ratio float64
	res   []float32
}

func newFakeTopK(n int, ratio float64) *fakeTopK {
	return &fakeTopK{n: n, ratio: ratio, res: make([]float32, n)}
}
func (*fakeTopK) Spec() string              { return "fake-topk" }
func (*fakeTopK) Class() compress.Class     { return compress.ClassSparse }
func (c *fakeTopK) k(n int) int             { return int(math.Ceil(c.ratio * float64(n))) }
func (c *fakeTopK) MaxEncodedLen(n int) int { return 4 + 8*c.k(n) }
func (c *fakeTopK) Reset()                  { clear(c.res) }
func (c *fakeTopK) Encode(dst []byte, src []float32, pos compress.Pos) ([]byte, error) {
	if pos.Offset < 0 || pos.Offset+len(src) > c.n {
		return dst, compress.ErrShape
	}
	a := make([]float32, len(src))
	copy(a, src)
	if pos.Feedback {
		for i := range a {
			a[i] += c.res[pos.Offset+i]
		}
	}
	idx := make([]int, len(a))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(x, y int) bool { return math.Abs(float64(a[idx[x]])) > math.Abs(float64(a[idx[y]])) })
	k := min(c.k(len(a)), len(a))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(k))
	for _, i := range idx[:k] {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(i))
		dst = putF(dst, a[i])
		a[i] = 0
	}
	if pos.Feedback {
		copy(c.res[pos.Offset:], a)
	}
	return dst, nil
}
func (c *fakeTopK) DecodeAdd(dst []float32, src []byte) error {
	if len(src) < 4 {
		return errLen(len(src), 4)
	}
	k := int(binary.LittleEndian.Uint32(src))
	if k > len(dst) || len(src) != 4+8*k {
		return errLen(len(src), 4+8*k)
	}
	for j := 0; j < k; j++ {
		i := int(binary.LittleEndian.Uint32(src[4+8*j:]))
		if i >= len(dst) {
			return fmt.Errorf("%w: index %d", compress.ErrCorrupt, i)
		}
		dst[i] += getF(src[8+8*j:])
	}
	return nil
}
func (c *fakeTopK) Decode(dst []float32, src []byte) error {
	clear(dst)
	return c.DecodeAdd(dst, src)
}

// fakeS8 is a shared-scale int8 codec (ClassSharedScale).
type fakeS8 struct{ bucket int }

func (fakeS8) Spec() string            { return "fake-s8" }
func (fakeS8) Class() compress.Class   { return compress.ClassSharedScale }
func (fakeS8) MaxEncodedLen(n int) int { return n }
func (fakeS8) Reset()                  {}
func (c fakeS8) Block() int            { return c.bucket }
func (c fakeS8) NumScales(n int) int   { return (n + c.bucket - 1) / c.bucket }
func (c fakeS8) Scales(dst, src []float32) {
	for b := 0; b < c.NumScales(len(src)); b++ {
		var m float32
		for _, v := range src[b*c.bucket : min(len(src), (b+1)*c.bucket)] {
			m = max(m, float32(math.Abs(float64(v))))
		}
		dst[b] = m
	}
}
func (c fakeS8) Encode(dst []byte, src []float32, pos compress.Pos) ([]byte, error) {
	s := make([]float32, c.NumScales(len(src)))
	c.Scales(s, src)
	return c.EncodeScaled(dst, src, s, 1, pos)
}
func (c fakeS8) EncodeScaled(dst []byte, src, absmax []float32, peers int, _ compress.Pos) ([]byte, error) {
	if len(absmax) != c.NumScales(len(src)) {
		return dst, compress.ErrShape
	}
	l := float64(127 / peers)
	for i, v := range src {
		m := absmax[i/c.bucket]
		q := 0.0
		if m > 0 {
			q = math.Round(float64(v) * l / float64(m))
		}
		q = max(-l, min(l, q))
		dst = append(dst, byte(int8(q)))
	}
	return dst, nil
}
func (c fakeS8) AddEncoded(a, b []byte) error {
	if len(a) != len(b) {
		return errLen(len(b), len(a))
	}
	for i := range a {
		a[i] = byte(int8(a[i]) + int8(b[i]))
	}
	return nil
}
func (c fakeS8) DecodeScaled(dst []float32, src []byte, absmax []float32, peers int) error {
	if len(src) != len(dst) || len(absmax) != c.NumScales(len(dst)) {
		return errLen(len(src), len(dst))
	}
	l := float32(127 / peers)
	for i := range dst {
		dst[i] = float32(int8(src[i])) * absmax[i/c.bucket] / l
	}
	return nil
}
func (c fakeS8) Decode(dst []float32, src []byte) error {
	return fmt.Errorf("fake-s8: Decode needs scales")
}
func (c fakeS8) DecodeAdd(dst []float32, src []byte) error {
	return fmt.Errorf("fake-s8: DecodeAdd needs scales")
}

// fakeLowRank all-reduces the two halves of the gradient as two "factors" (ClassLowRank).
type fakeLowRank struct {
	n    int
	grad []float32
}

func (*fakeLowRank) Spec() string            { return "fake-lowrank" }
func (*fakeLowRank) Class() compress.Class   { return compress.ClassLowRank }
func (*fakeLowRank) MaxEncodedLen(n int) int { return 4 * n }
func (*fakeLowRank) Reset()                  {}
func (*fakeLowRank) ResetShared()            {}
func (*fakeLowRank) Rounds() int             { return 2 }
func (*fakeLowRank) Encode(dst []byte, src []float32, _ compress.Pos) ([]byte, error) {
	return nil, fmt.Errorf("fake-lowrank: no Encode")
}
func (*fakeLowRank) Decode(dst []float32, src []byte) error    { return fmt.Errorf("no") }
func (*fakeLowRank) DecodeAdd(dst []float32, src []byte) error { return fmt.Errorf("no") }
func (c *fakeLowRank) Factor(round int, step uint64, grad []float32) ([]float32, error) {
	if round == 0 {
		c.grad = append(c.grad[:0], grad...)
		return c.grad[:c.n/2], nil
	}
	return c.grad[c.n/2:], nil
}
func (c *fakeLowRank) Absorb(round int, sum []float32, peers int, out []float32) error {
	off := 0
	if round == 1 {
		off = c.n / 2
	}
	for i, v := range sum {
		out[off+i] = v / float32(peers)
	}
	return nil
}
