package compress

import (
	"encoding/binary"
	"fmt"
	"math"
)

// PowerSGD ("powersgd:rank=r") and ACP-SGD ("acpsgd:rank=r") work per tensor of
// the layout: a tensor with at least two dimensions is viewed as an n×m matrix
// (n = first dimension, m = the rest) and compressed to rank r unless
// (n + m)·r >= n·m/2; vectors and small matrices travel uncompressed, in the same
// factor. Each matrix keeps an error E (n×m, local to the peer) and the shared
// factor state (Q m×r, initialised from Options.SharedSeed: uniform in [−1, 1)).
//
// PowerSGD, two all-reduces per step: P = (M + E)·Q; P̂ = orth(ΣP); Q_local =
// (M + E)ᵀP̂; Q = ΣQ_local/W (the next step's warm start); output P̂Qᵀ; error
// style "local": E = M + E − P̂Q_localᵀ.
//
// ACP-SGD, one all-reduce per step, alternating: on a P-step Q̂ = orth(Q),
// P = (M + E)Q̂, E = M + E − PQ̂ᵀ, output ΣP·Q̂ᵀ/W; on a Q-step P̂ = orth(P),
// Q = (M + E)ᵀP̂, E = M + E − P̂Qᵀ, output P̂·ΣQᵀ/W (P and Q being the last sums).
//
// ACP-SGD projects each step's M + E onto a basis (Q̂ or P̂) made from the previous
// step, where PowerSGD's P̂ comes from this step's M + E; so ACP-SGD sends less of
// the fresh gradient and error feedback sends the rest later, stale. On the
// trainer's mlp (4 peers, rank 4; TestLowRankTraining in acp_sim_test.go) the
// sent gradient's cosine with the fp32 mean is about 0.1–0.4 per hidden layer
// against PowerSGD's 0.5–0.75, and starting ACP-SGD at the learning-rate peak
// costs about 0.7 pp of final accuracy where starting it after 200 fp32 steps
// costs about 0.2–0.4 pp.
//
// State changes (E, Q, P, the ACP-SGD phase) are committed by the last Absorb of
// a step, so a step aborted anywhere can be retried from Factor(0, …) with the
// same gradient. Encode runs a whole single-peer step and writes, per tensor in
// layout order, the two fp32 factors A (n×r) and B (m×r) of the output A·Bᵀ, or
// the raw values of an uncompressed tensor; Decode computes A·Bᵀ. Encode needs the
// whole bucket (Offset 0, len = Layout.Len()).
//
// Non-finite values: a matrix whose local factor is not finite gets its E reset;
// one whose all-reduced factor is not finite decodes to NaN and its shared state
// is reset to the seeded initial value (identically on every peer, since every
// peer sees the same sum).

type lrTensor struct {
	off, n, m int
	matrix    bool
	e, mp     []float32 // error and M + E (then the new error), n×m
	q         []float32 // PowerSGD: warm-start Q; ACP-SGD: last ΣQ (m×r)
	p         []float32 // PowerSGD: P̂; ACP-SGD: last ΣP (n×r)
	hat       []float32 // ACP-SGD: orth of the other factor (n×r or m×r)
	local     []float32 // the local factor of the step (n×r or m×r)
	bad       bool      // the local factor was not finite
}

type lowRankCodec struct {
	base
	acp     bool
	rank    int
	seed    uint64
	tensors []lrTensor
	factor  []float32 // the factor handed out
	raw     []float32 // round-0 sums of uncompressed tensors (PowerSGD)
	stage   int       // PowerSGD: 0 idle, 1 after Factor(0), 2 after Absorb(0), 3 after Factor(1); ACP-SGD: 0, 1
	qStep   bool      // ACP-SGD: the next step is a Q-step
	useE    bool      // the step in flight applies and updates E
}

var _ LowRank = (*lowRankCodec)(nil)

func buildPowerSGD(p params, opts Options) (Codec, error) {
	return newLowRank(p.canonical(), p.int("rank"), opts, false, false), nil
}

func buildACPSGD(p params, opts Options) (Codec, error) {
	return newLowRank(p.canonical(), p.int("rank"), opts, true, false), nil
}

// newLowRank builds a low-rank codec; force compresses every tensor with two or
// more dimensions whatever its size (for tests on small matrices).
func newLowRank(spec string, rank int, opts Options, acp, force bool) *lowRankCodec {
	c := &lowRankCodec{
		base: newBase(spec, ClassLowRank, opts.Layout.Len()),
		acp:  acp, rank: rank, seed: opts.SharedSeed,
	}
	r, off, maxF := c.rank, 0, 0
	for _, s := range opts.Layout.Shapes {
		t := lrTensor{off: off, n: 1, m: 1}
		for i, d := range s {
			if i == 0 {
				t.n = d
			} else {
				t.m *= d
			}
		}
		t.matrix = len(s) >= 2 && t.n > 0 && t.m > 0 && (force || 2*(t.n+t.m)*r < t.n*t.m)
		if t.matrix {
			t.e = make([]float32, t.n*t.m)
			t.mp = make([]float32, t.n*t.m)
			t.q = make([]float32, t.m*r)
			t.p = make([]float32, t.n*r)
			t.local = make([]float32, max(t.n, t.m)*r)
			if acp {
				t.hat = make([]float32, max(t.n, t.m)*r)
			}
			maxF += max(t.n, t.m) * r
		} else {
			maxF += t.n * t.m
		}
		off += t.n * t.m
		c.tensors = append(c.tensors, t)
	}
	c.factor = make([]float32, 0, maxF)
	if !acp {
		c.raw = make([]float32, off)
	}
	c.ResetShared()
	return c
}

// Rounds returns the number of all-reduces per step: PowerSGD 2, ACP-SGD 1.
func (c *lowRankCodec) Rounds() int {
	if c.acp {
		return 1
	}
	return 2
}

// ResetShared returns Q to its seeded initial value and ACP-SGD to a P-step.
func (c *lowRankCodec) ResetShared() {
	for i := range c.tensors {
		c.resetShared(i)
	}
	c.qStep = false
	c.stage = 0
}

func (c *lowRankCodec) resetShared(i int) {
	t := &c.tensors[i]
	if !t.matrix {
		return
	}
	fillUniform(t.q, mix64(c.seed^0x5851f42d4c957f2d+uint64(i)*golden), 0)
	for k, u := range t.q {
		t.q[k] = 2*u - 1
	}
	clear(t.p)
}

// Reset zeroes the error-feedback state E of every matrix.
func (c *lowRankCodec) Reset() {
	for i := range c.tensors {
		clear(c.tensors[i].e)
	}
}

// isPFactor reports whether the step's (first) factor is P.
func (c *lowRankCodec) isPFactor() bool { return !c.acp || !c.qStep }

// Factor returns the round's local factor. Round 0 takes the bucket's gradient
// (len Layout.Len()); PowerSGD's round 1 takes nil.
func (c *lowRankCodec) Factor(round int, step uint64, grad []float32) ([]float32, error) {
	if round == 0 {
		return c.factor0(grad, true)
	}
	if c.acp || round != 1 || c.stage != 2 {
		return nil, c.orderError("Factor", round)
	}
	c.factor = c.factor[:0]
	for i := range c.tensors {
		t := &c.tensors[i]
		if !t.matrix {
			continue
		}
		// Q_local = (M + E)ᵀP̂, then the new error E = M + E − P̂Q_localᵀ in mp.
		ql := t.local[:t.m*c.rank]
		mulT(ql, t.mp, t.p, t.n, t.m, c.rank)
		if c.useE {
			subOuter(t.mp, t.p, ql, t.n, t.m, c.rank)
		}
		t.bad = t.bad || !allFinite(ql)
		c.factor = append(c.factor, ql...)
	}
	c.stage = 3
	return c.factor, nil
}

func (c *lowRankCodec) orderError(op string, round int) error {
	return fmt.Errorf("compress: %s: %s(round %d) out of order (stage %d)", c.spec, op, round, c.stage)
}

// factor0 starts a step: M' = grad (+ E), and the first factor.
func (c *lowRankCodec) factor0(grad []float32, useE bool) ([]float32, error) {
	if len(grad) != c.total {
		return nil, fmt.Errorf("compress: %s: gradient of %d values for a bucket of %d: %w",
			c.spec, len(grad), c.total, ErrShape)
	}
	c.useE = useE
	r := c.rank
	c.factor = c.factor[:0]
	for i := range c.tensors {
		t := &c.tensors[i]
		g := grad[t.off : t.off+t.n*t.m]
		if !t.matrix {
			c.factor = append(c.factor, g...)
			continue
		}
		var e []float32
		if useE {
			e = t.e
		}
		if c.isPFactor() {
			q := t.q
			if c.acp { // Q̂ = orth(ΣQ)
				q = t.hat[:t.m*r]
				copy(q, t.q)
				orthonormalize(q, t.m, r)
			}
			p := t.local[:t.n*r]
			prepMul(p, t.mp, g, e, q, t.n, t.m, r)
			if c.acp && useE {
				subOuter(t.mp, p, q, t.n, t.m, r)
			}
			t.bad = !allFinite(p)
			c.factor = append(c.factor, p...)
			continue
		}
		// ACP-SGD Q-step: P̂ = orth(ΣP), Q = (M + E)ᵀP̂, E = M + E − P̂Qᵀ.
		ph := t.hat[:t.n*r]
		copy(ph, t.p)
		orthonormalize(ph, t.n, r)
		if e != nil {
			for k := range t.mp {
				t.mp[k] = g[k] + e[k]
			}
		} else {
			copy(t.mp, g)
		}
		ql := t.local[:t.m*r]
		mulT(ql, t.mp, ph, t.n, t.m, r)
		if useE {
			subOuter(t.mp, ph, ql, t.n, t.m, r)
		}
		t.bad = !allFinite(ql)
		c.factor = append(c.factor, ql...)
	}
	c.stage = 1
	return c.factor, nil
}

// factorLen returns the length of the round's factor.
func (c *lowRankCodec) factorLen(round int) int {
	l := 0
	for _, t := range c.tensors {
		switch {
		case !t.matrix && round == 0:
			l += t.n * t.m
		case t.matrix && round == 0 && c.isPFactor():
			l += t.n * c.rank
		case t.matrix:
			l += t.m * c.rank
		}
	}
	return l
}

// Absorb takes the all-reduced SUM of the round's factor from peers peers; after
// the last round it writes the averaged gradient (len Layout.Len()) into out and
// commits the step's state.
func (c *lowRankCodec) Absorb(round int, sum []float32, peers int, out []float32) error {
	if round != c.stage/2 || c.stage%2 != 1 || round >= c.Rounds() {
		return c.orderError("Absorb", round)
	}
	if len(sum) != c.factorLen(round) {
		return fmt.Errorf("compress: %s: round %d sum of %d values, want %d: %w",
			c.spec, round, len(sum), c.factorLen(round), ErrShape)
	}
	if peers < 1 {
		return fmt.Errorf("compress: %s: %d peers: %w", c.spec, peers, ErrShape)
	}
	last := round == c.Rounds()-1
	if last && len(out) != c.total {
		return fmt.Errorf("compress: %s: output of %d values for a bucket of %d: %w",
			c.spec, len(out), c.total, ErrShape)
	}
	inv := 1 / float32(peers)
	r := c.rank
	for i := range c.tensors {
		t := &c.tensors[i]
		var o []float32
		if last {
			o = out[t.off : t.off+t.n*t.m]
		}
		if !t.matrix {
			if round != 0 {
				continue
			}
			s := sum[:t.n*t.m]
			sum = sum[len(s):]
			if c.acp {
				scaleInto(o, s, inv)
			} else {
				copy(c.raw[t.off:], s)
			}
			continue
		}
		switch {
		case !c.acp && round == 0: // P̂ = orth(ΣP)
			copy(t.p, sum[:t.n*r])
			sum = sum[t.n*r:]
			orthonormalize(t.p, t.n, r)
		case !c.acp: // Q = ΣQ/W; output P̂Qᵀ
			scaleInto(t.q, sum[:t.m*r], inv)
			sum = sum[t.m*r:]
			outer(o, t.p, t.q, t.n, t.m, r, 1)
		case c.isPFactor(): // output ΣP·Q̂ᵀ/W
			copy(t.p, sum[:t.n*r])
			sum = sum[t.n*r:]
			outer(o, t.p, t.hat, t.n, t.m, r, inv)
		default: // output P̂·ΣQᵀ/W
			copy(t.q, sum[:t.m*r])
			sum = sum[t.m*r:]
			outer(o, t.hat, t.q, t.n, t.m, r, inv)
		}
		if last {
			c.commitTensor(i, o)
		}
	}
	if !last {
		c.stage = 2
		return nil
	}
	if !c.acp {
		for _, t := range c.tensors {
			if !t.matrix {
				scaleInto(out[t.off:t.off+t.n*t.m], c.raw[t.off:t.off+t.n*t.m], inv)
			}
		}
	}
	c.qStep = c.acp && !c.qStep
	c.stage = 0
	return nil
}

// commitTensor ends a step for matrix i: the new error becomes E, and a
// non-finite shared factor (so o, if given, is NaN) resets the shared state.
func (c *lowRankCodec) commitTensor(i int, o []float32) {
	t := &c.tensors[i]
	if c.useE {
		t.e, t.mp = t.mp, t.e
		if t.bad {
			clear(t.e)
		}
	}
	if !allFinite(t.q) || !allFinite(t.p) {
		c.resetShared(i)
		for k := range o {
			o[k] = canonicalNaN
		}
	}
}

// scaleInto sets dst = src·s.
func scaleInto(dst, src []float32, s float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = src[i] * s
	}
}

// payloadLen is the size of Encode's output for the whole bucket.
func (c *lowRankCodec) payloadLen() int {
	l := 0
	for _, t := range c.tensors {
		if t.matrix {
			l += 4 * (t.n + t.m) * c.rank
		} else {
			l += 4 * t.n * t.m
		}
	}
	return l
}

// MaxEncodedLen returns the payload size of the whole bucket (the only size Encode takes).
func (c *lowRankCodec) MaxEncodedLen(n int) int { return c.payloadLen() }

// Encode runs one single-peer step on the whole bucket and appends the factors.
func (c *lowRankCodec) Encode(dst []byte, src []float32, pos Pos) ([]byte, error) {
	if pos.Offset != 0 || len(src) != c.total {
		return dst, fmt.Errorf("compress: %s: encode [%d, %d) of a bucket of %d values (needs all of it): %w",
			c.spec, pos.Offset, pos.Offset+len(src), c.total, ErrShape)
	}
	f, err := c.factor0(src, pos.Feedback)
	if err != nil {
		return dst, err
	}
	if !c.acp {
		if err := c.Absorb(0, f, 1, nil); err != nil {
			return dst, err
		}
		if _, err := c.Factor(1, pos.Step, nil); err != nil {
			return dst, err
		}
	}
	dst, out := grow(dst, c.payloadLen())
	r := c.rank
	put := func(v []float32) {
		for i, x := range v {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		}
		out = out[4*len(v):]
	}
	for i := range c.tensors {
		t := &c.tensors[i]
		switch {
		case !t.matrix:
			put(src[t.off : t.off+t.n*t.m])
			continue
		case !c.acp: // P̂, Q = Q_local
			copy(t.q, t.local[:t.m*r])
			put(t.p)
			put(t.q)
		case c.isPFactor(): // P, Q̂
			copy(t.p, t.local[:t.n*r])
			put(t.p)
			put(t.hat[:t.m*r])
		default: // P̂, Q
			copy(t.q, t.local[:t.m*r])
			put(t.hat[:t.n*r])
			put(t.q)
		}
		c.commitTensor(i, nil)
	}
	c.qStep = c.acp && !c.qStep
	c.stage = 0
	return dst, nil
}

func (c *lowRankCodec) Decode(dst []float32, src []byte) error { return c.decode(dst, src, false) }

func (c *lowRankCodec) DecodeAdd(dst []float32, src []byte) error { return c.decode(dst, src, true) }

func (c *lowRankCodec) decode(dst []float32, src []byte, add bool) error {
	if len(dst) != c.total {
		return fmt.Errorf("compress: %s: decode into %d values for a bucket of %d: %w",
			c.spec, len(dst), c.total, ErrShape)
	}
	if len(src) != c.payloadLen() {
		return corruptf(c.name, "payload of %d bytes, want %d", len(src), c.payloadLen())
	}
	r := c.rank
	for _, t := range c.tensors {
		o := dst[t.off : t.off+t.n*t.m]
		if !t.matrix {
			for i := range o {
				v := getF32(src[4*i:])
				if add {
					o[i] += v
				} else {
					o[i] = v
				}
			}
			src = src[4*len(o):]
			continue
		}
		a, b := src[:4*t.n*r], src[4*t.n*r:4*(t.n+t.m)*r]
		outerBytes(o, a, b, t.n, t.m, r, add)
		src = src[4*(t.n+t.m)*r:]
	}
	return nil
}

// outerBytes writes or adds a·bᵀ with a (n×r) and b (m×r) read from
// little-endian fp32 bytes; the sums are those of outer.
func outerBytes(out []float32, a, b []byte, n, m, r int, add bool) {
	var ai [2 * maxRank]float32
	b = b[:4*m*r]
	i := 0
	if r == 4 {
		for ; i+2 <= n; i += 2 {
			for j := range 8 {
				ai[j] = getF32(a[4*(4*i+j):])
			}
			r0, r1 := out[i*m:i*m+m], out[i*m+m:i*m+2*m]
			a0, a1, a2, a3 := ai[0], ai[1], ai[2], ai[3]
			c0, c1, c2, c3 := ai[4], ai[5], ai[6], ai[7]
			for k := range r0 {
				bk := b[16*k : 16*k+16 : 16*k+16]
				b0, b1, b2, b3 := getF32(bk), getF32(bk[4:]), getF32(bk[8:]), getF32(bk[12:])
				x := float32(a0*b0) + float32(a1*b1) + float32(a2*b2) + float32(a3*b3)
				y := float32(c0*b0) + float32(c1*b1) + float32(c2*b2) + float32(c3*b3)
				if add {
					r0[k] += x
					r1[k] += y
				} else {
					r0[k], r1[k] = x, y
				}
			}
		}
	}
	for ; i < n; i++ {
		for j := range r {
			ai[j] = getF32(a[4*(i*r+j):])
		}
		row := out[i*m : i*m+m]
		for k := range row {
			bk := b[4*k*r:]
			s := float32(ai[0] * getF32(bk))
			for j := 1; j < r; j++ {
				s += float32(ai[j] * getF32(bk[4*j:]))
			}
			if add {
				row[k] += s
			} else {
				row[k] = s
			}
		}
	}
}
