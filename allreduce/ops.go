package allreduce

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/internal/finite"
)

// Random-stream numbers passed in compress.Pos.Stream.
const (
	streamLocal = 0 // a peer's own contribution
	streamOwner = 1 // an owner's single re-encode (direct schedule); ring hops use 1..W-1
)

// bucketCtx is what every class's ops share for one bucket.
type bucketCtx struct {
	step  uint64
	w     int
	rank  int
	data  []float32 // this peer's input
	out   []float32 // scratch output
	codec compress.Codec
	tmp   []float32
	tmpB  []byte
	// pool, when set, supplies tmp and takes it back (release).
	pool *floatPool
}

// scratch returns a buffer of n values with stale contents.
func (b *bucketCtx) scratch(n int) []float32 {
	if cap(b.tmp) < n {
		if b.pool != nil {
			b.pool.put(b.tmp)
			b.tmp = b.pool.get(n)
		} else {
			b.tmp = make([]float32, n)
		}
	}
	return b.tmp[:n]
}

// release gives the scratch buffer back to the pool.
func (b *bucketCtx) release() {
	if b.pool != nil {
		b.pool.put(b.tmp)
		b.tmp = nil
	}
}

func (b *bucketCtx) pos(c chunk, stream uint32, feedback bool) compress.Pos {
	return compress.Pos{Offset: c.off, Step: b.step, Stream: stream, Feedback: feedback}
}

func corrupt(rank int, err error) error { return &payloadErr{rank: rank, err: err} }

// divide writes x/W (W as float32) over x.
func divide(x []float32, w int) {
	if w == 1 {
		return
	}
	d := float32(w)
	for i := range x {
		x[i] /= d
	}
}

// codecOps carry linear, quantized, error-feedback and sparse codecs.
// feedback: the local encode applies error feedback (and the owner then uses
// the decoded local encoding as this peer's contribution).
//
// With per-link codecs (ring schedule only) sendC encodes reduce-scatter
// frames to the next peer, recvC decodes those from the previous peer, and
// codec (the final codec) encodes the owner's bytes and decodes the all-gather.
type codecOps struct {
	*bucketCtx
	feedback     bool
	sendC, recvC compress.Codec
	// robust, when set, makes the owner combine contributions with
	// centered clipping (direct schedule) instead of averaging them.
	robust *robustOps
}

func (x *codecOps) maxLen(n int) int {
	m := x.codec.MaxEncodedLen(n)
	if x.sendC != nil {
		m = max(m, x.sendC.MaxEncodedLen(n))
	}
	return m
}

func (x *codecOps) send() compress.Codec {
	if x.sendC != nil {
		return x.sendC
	}
	return x.codec
}

func (x *codecOps) recv() compress.Codec {
	if x.recvC != nil {
		return x.recvC
	}
	return x.codec
}

func (x *codecOps) local(dst []byte, c chunk) ([]byte, error) {
	return x.send().Encode(dst, x.data[c.off:c.off+c.n], x.pos(c, streamLocal, x.feedback))
}

func (x *codecOps) contrib(dst []byte, c chunk) ([]byte, error) {
	return x.codec.Encode(dst, x.data[c.off:c.off+c.n], x.pos(c, streamLocal, x.feedback))
}

func (x *codecOps) combine(dst []byte, c chunk, recv []byte, hop int, last bool) ([]byte, error) {
	t := x.scratch(c.n)
	if err := x.absorb(t, c, recv); err != nil {
		return nil, err
	}
	enc := x.send()
	if last {
		divide(t, x.w)
		enc = x.codec
	}
	return enc.Encode(dst, t, x.pos(c, uint32(hop), false))
}

// absorb decodes recv (a partial sum from the previous peer of a ring) into
// t and adds this peer's contribution to chunk c.
func (x *codecOps) absorb(t []float32, c chunk, recv []byte) error {
	if err := x.recv().Decode(t, recv); err != nil {
		return corrupt(-1, err)
	}
	if finite.Has(t) {
		// An honest peer never forwards a non-finite partial sum (it fails
		// here instead), so the previous peer put it in.
		return corrupt(-1, errNonFiniteContribution)
	}
	d := x.data[c.off : c.off+c.n]
	for i := range t {
		t[i] += d[i]
	}
	return nil
}

func (x *codecOps) reduce(dst []byte, c chunk, contribs [][]byte) ([]byte, error) {
	if x.robust != nil {
		return x.reduceRobust(dst, c, contribs)
	}
	t := x.scratch(c.n)
	clear(t)
	d := x.data[c.off : c.off+c.n]
	for j := 0; j < x.w; j++ {
		if j != x.rank {
			if err := x.codec.DecodeAdd(t, contribs[j]); err != nil {
				return nil, corrupt(j, err)
			}
			continue
		}
		if !x.feedback {
			for i := range t {
				t[i] += d[i]
			}
			continue
		}
		own, err := x.codec.Encode(x.tmpB[:0], d, x.pos(c, streamLocal, true))
		if err != nil {
			return nil, err
		}
		x.tmpB = own
		if err := x.codec.DecodeAdd(t, own); err != nil {
			return nil, fmt.Errorf("decode own encoding: %w", err)
		}
	}
	if finite.Has(t) {
		if j := x.nonFiniteMember(c, contribs); j >= 0 {
			return nil, corrupt(j, errNonFiniteContribution)
		}
		// Finite contributions whose sum overflowed: the trainer sees a
		// non-finite average and retries the step; nobody is to blame.
	}
	divide(t, x.w)
	return x.codec.Encode(dst, t, x.pos(c, streamOwner, false))
}

func (x *codecOps) finish(c chunk, payload []byte) error {
	if err := x.codec.Decode(x.out[c.off:c.off+c.n], payload); err != nil {
		return corrupt(-1, err)
	}
	return nil
}

func (x *codecOps) combineAll(c chunk, payloads [][]byte) error {
	o := x.out[c.off : c.off+c.n]
	clear(o)
	for j, p := range payloads {
		if err := x.codec.DecodeAdd(o, p); err != nil {
			return corrupt(j, err)
		}
	}
	divide(o, x.w)
	return nil
}

// scaleOps carry shared-scale codecs: payloads are summed as integers with
// agreed per-bucket scales (absmax, after a MAX all-reduce).
type scaleOps struct {
	*bucketCtx
	ss     compress.SharedScaler
	absmax []float32
	gran   int
}

func (x *scaleOps) maxLen(n int) int { return x.codec.MaxEncodedLen(n) }

func (x *scaleOps) scales(c chunk) []float32 {
	a := c.off / x.gran
	return x.absmax[a : a+x.ss.NumScales(c.n)]
}

func (x *scaleOps) local(dst []byte, c chunk) ([]byte, error) {
	return x.ss.EncodeScaled(dst, x.data[c.off:c.off+c.n], x.scales(c), x.w, x.pos(c, streamLocal, false))
}

func (x *scaleOps) contrib(dst []byte, c chunk) ([]byte, error) { return x.local(dst, c) }

func (x *scaleOps) combine(dst []byte, c chunk, recv []byte, hop int, last bool) ([]byte, error) {
	own, err := x.local(x.tmpB[:0], c)
	if err != nil {
		return nil, err
	}
	x.tmpB = own
	dst = append(dst, recv...)
	if err := x.ss.AddEncoded(dst[HeaderSize:], own); err != nil {
		return nil, corrupt(-1, err)
	}
	return dst, nil
}

func (x *scaleOps) reduce(dst []byte, c chunk, contribs [][]byte) ([]byte, error) {
	own, err := x.local(x.tmpB[:0], c)
	if err != nil {
		return nil, err
	}
	x.tmpB = own
	for j := 0; j < x.w; j++ {
		p := contribs[j]
		if j == x.rank {
			p = own
		}
		if j == 0 {
			dst = append(dst, p...)
			continue
		}
		if err := x.ss.AddEncoded(dst[HeaderSize:], p); err != nil {
			return nil, corrupt(j, err)
		}
	}
	return dst, nil
}

func (x *scaleOps) finish(c chunk, payload []byte) error {
	o := x.out[c.off : c.off+c.n]
	if err := x.ss.DecodeScaled(o, payload, x.scales(c), x.w); err != nil {
		return corrupt(-1, err)
	}
	divide(o, x.w)
	return nil
}

// rawOps carry plain fp32 values (scales, low-rank factors) with SUM or MAX
// and no division.
type rawOps struct {
	*bucketCtx
	max bool
}

func (x *rawOps) maxLen(n int) int { return 4 * n }

// op combines two values: their sum, or with max their maximum, where a
// NaN operand wins, so a NaN scale on any peer reaches every peer's average
// as non-finite values, as the codec contract says.
func (x *rawOps) op(a, b float32) float32 {
	if x.max {
		switch {
		case a != a:
			return a
		case b != b, b > a:
			return b
		}
		return a
	}
	return a + b
}

func appendF32(dst []byte, v []float32) []byte {
	for _, f := range v {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
	}
	return dst
}

func getF32(p []byte, i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
}

func checkRaw(p []byte, n int) error {
	if len(p) != 4*n {
		return fmt.Errorf("%w: raw payload %d bytes, want %d", compress.ErrCorrupt, len(p), 4*n)
	}
	return nil
}

func (x *rawOps) local(dst []byte, c chunk) ([]byte, error) {
	return appendF32(dst, x.data[c.off:c.off+c.n]), nil
}

func (x *rawOps) contrib(dst []byte, c chunk) ([]byte, error) { return x.local(dst, c) }

func (x *rawOps) combine(dst []byte, c chunk, recv []byte, hop int, last bool) ([]byte, error) {
	if err := checkRaw(recv, c.n); err != nil {
		return nil, corrupt(-1, err)
	}
	d := x.data[c.off : c.off+c.n]
	for i := range d {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x.op(getF32(recv, i), d[i])))
	}
	return dst, nil
}

func (x *rawOps) reduce(dst []byte, c chunk, contribs [][]byte) ([]byte, error) {
	t := x.scratch(c.n)
	d := x.data[c.off : c.off+c.n]
	for j := 0; j < x.w; j++ {
		if j != x.rank {
			if err := checkRaw(contribs[j], c.n); err != nil {
				return nil, corrupt(j, err)
			}
		}
		for i := range t {
			v := d[i]
			if j != x.rank {
				v = getF32(contribs[j], i)
			}
			if j == 0 {
				t[i] = v
			} else {
				t[i] = x.op(t[i], v)
			}
		}
	}
	return appendF32(dst, t), nil
}

func (x *rawOps) finish(c chunk, payload []byte) error {
	if err := checkRaw(payload, c.n); err != nil {
		return corrupt(-1, err)
	}
	o := x.out[c.off : c.off+c.n]
	for i := range o {
		o[i] = getF32(payload, i)
	}
	return nil
}
