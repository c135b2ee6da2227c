package allreduce

import (
	"errors"
	"fmt"
)

// payloadErr marks a decode failure of a payload that came from rank.
type payloadErr struct {
	rank int
	err  error
}

func (e *payloadErr) Error() string { return e.err.Error() }
func (e *payloadErr) Unwrap() error { return e.err }

// opFail turns an ops error into the session failure: a payload error names
// its sender (or from, when the ops did not know it), anything else is local.
func (o *op) opFail(from int, err error) error {
	var pe *payloadErr
	if errors.As(err, &pe) {
		if pe.rank >= 0 {
			from = pe.rank
		}
		if from == o.s.rank || from < 0 {
			return o.failLocal(err)
		}
		return o.failPeer(from, fmt.Errorf("%w: %w", ErrBadFrame, pe.err))
	}
	return o.failLocal(err)
}

// ringOps is what the ring schedule asks of a codec class.
type ringOps interface {
	maxLen(n int) int
	// local appends the encoding of this peer's contribution to chunk c.
	local(dst []byte, c chunk) ([]byte, error)
	// combine appends the encoding of recv (a partial result from the
	// previous peer) combined with this peer's contribution; when last it is
	// the final (averaged) result of the chunk.
	combine(dst []byte, c chunk, recv []byte, hop int, last bool) ([]byte, error)
	// finish decodes a final payload into the chunk's output.
	finish(c chunk, payload []byte) error
}

// directOps is what the direct (two-phase) schedule asks of a codec class.
type directOps interface {
	maxLen(n int) int
	// contrib appends this peer's contribution to chunk c, for its owner.
	contrib(dst []byte, c chunk) ([]byte, error)
	// reduce appends the final payload of chunk c from every peer's
	// contribution in rank order (contribs[self] is nil: the ops use their own data).
	reduce(dst []byte, c chunk, contribs [][]byte) ([]byte, error)
	finish(c chunk, payload []byte) error
}

// gatherOps is what the all-gather schedule asks of a codec class.
type gatherOps interface {
	maxLen(n int) int
	local(dst []byte, c chunk) ([]byte, error)
	// combineAll decodes every peer's payload of chunk c (rank order) into the output.
	combineAll(c chunk, payloads [][]byte) error
}

// ringPass is one ring of a schedule: session ranks in ring order, this
// peer's position in it, the chunk range of each ring segment, and the
// phases its frames carry. As in the flat ring, the reduce-scatter leaves
// the peer at position q with segment q+1, whose bytes the all-gather
// carries on.
type ringPass struct {
	ranks []int
	me    int
	// segs[i] is the chunk index range [a, b) of ring segment i.
	segs   [][2]int
	rs, ag Phase
	// hop0 is added to the hop numbers handed to the codec (its streams),
	// so that the passes of one bucket use distinct ones.
	hop0 int
}

// flatPass is the ring of every peer of the session over layout l.
func flatPass(s *Session, l *layout, sub int) *ringPass {
	p := &ringPass{me: s.rank, rs: subPhase(PhaseReduce, sub), ag: subPhase(PhaseGather, sub)}
	for i := 0; i < s.w; i++ {
		p.ranks = append(p.ranks, i)
		p.segs = append(p.segs, [2]int{l.segFirst[i], l.segFirst[i+1]})
	}
	return p
}

func (p *ringPass) next() int { return p.ranks[(p.me+1)%len(p.ranks)] }
func (p *ringPass) prev() int { return p.ranks[(p.me+len(p.ranks)-1)%len(p.ranks)] }

// seg returns the chunk range of ring segment i (taken modulo the ring size).
func (p *ringPass) seg(i int) (int, int) {
	n := len(p.ranks)
	s := p.segs[(i%n+n)%n]
	return s[0], s[1]
}

// received is the number of frames this peer receives in the
// reduce-scatter (every segment but its own first one) and the all-gather
// (every segment but the one it owns).
func (p *ringPass) received() int {
	all := 0
	for i := range p.segs {
		all += p.segs[i][1] - p.segs[i][0]
	}
	a, b := p.seg(p.me)
	c, d := p.seg(p.me + 1)
	return 2*all - (b - a) - (d - c)
}

// ringReduce runs reduce-scatter then all-gather around the ring. Rank r
// owns segment r+1: it produces that segment's final bytes, which travel
// unchanged around the ring, and every peer (r too) decodes them.
func ringReduce(o *op, l *layout, ops ringOps, sub int) error {
	p := flatPass(o.s, l, sub)
	o.begin(2 * len(l.chunks))
	if err := ringScatter(o, p, l, ops, p.finalHop(o, l, ops, nil)); err != nil {
		return err
	}
	return ringGather(o, p, l, ops, nil)
}

// ringScatter runs the reduce-scatter of pass p: this peer sends its own
// encoding of segment me to the next peer, then n−1 times receives segment
// me−k−1 from the previous one, combines it with its own data and passes it
// on; the last step's chunks (segment me+1, summed over every peer before
// this one) go to last instead, which must not keep recv past its return
// (the frame's buffer is recycled then).
func ringScatter(o *op, p *ringPass, l *layout, ops ringOps, last func(i int, c chunk, recv []byte) error) error {
	n := len(p.ranks)
	next, prev := p.next(), p.prev()
	a, b := p.seg(p.me)
	for i := a; i < b; i++ {
		c := l.chunks[i]
		f, err := ops.local(o.newFrame(ops.maxLen(c.n)), c)
		if err != nil {
			return o.opFail(-1, err)
		}
		if err := o.seal(f, p.rs, i); err != nil {
			return err
		}
		o.s.handOff(next, f)
	}
	for k := 0; k < n-1; k++ {
		a, b := p.seg(p.me - k - 1)
		for i := a; i < b; i++ {
			c := l.chunks[i]
			raw, pl, err := o.recv(prev, p.rs, i)
			if err != nil {
				return err
			}
			if k == n-2 {
				if err := last(i, c, pl); err != nil {
					return err
				}
				o.release(raw)
				continue
			}
			f, err := ops.combine(o.newFrame(ops.maxLen(c.n)), c, pl, p.hop0+k+1, false)
			if err != nil {
				return o.opFail(prev, err)
			}
			o.release(raw)
			if err := o.seal(f, p.rs, i); err != nil {
				return err
			}
			o.s.handOff(next, f)
		}
	}
	return nil
}

// finalHop is the last reduce-scatter step of an all-reduce over pass p:
// the owner adds its data, encodes the final (averaged) bytes, sends them
// on as the first all-gather hop and decodes them itself; keep, when set,
// is handed each chunk's final payload.
func (p *ringPass) finalHop(o *op, l *layout, ops ringOps, keep func(i int, payload []byte)) func(int, chunk, []byte) error {
	return func(i int, c chunk, recv []byte) error {
		f, err := ops.combine(o.newFrame(ops.maxLen(c.n)), c, recv, p.hop0+len(p.ranks)-1, true)
		if err != nil {
			return o.opFail(p.prev(), err)
		}
		if err := o.seal(f, p.ag, i); err != nil {
			return err
		}
		if keep != nil {
			o.s.send(p.next(), f)
			keep(i, f[HeaderSize:])
		}
		if err := ops.finish(c, f[HeaderSize:]); err != nil {
			return o.opFail(-1, err)
		}
		if keep == nil {
			o.s.handOff(p.next(), f) // decoded: nothing reads it here any more
		}
		return nil
	}
}

// ringGather runs the all-gather of pass p: n−1 times this peer receives
// segment me−k (owned by the peer k+1 places back) from the previous peer,
// passes the frame on unchanged unless the next peer owns it, and decodes
// it; keep, when set, is handed each payload.
func ringGather(o *op, p *ringPass, l *layout, ops ringOps, keep func(i int, payload []byte)) error {
	n := len(p.ranks)
	next, prev := p.next(), p.prev()
	for k := 0; k < n-1; k++ {
		a, b := p.seg(p.me - k)
		for i := a; i < b; i++ {
			raw, pl, err := o.recv(prev, p.ag, i)
			if err != nil {
				return err
			}
			if keep != nil {
				if k < n-2 {
					o.s.send(next, raw)
				}
				keep(i, pl)
			}
			if err := ops.finish(l.chunks[i], pl); err != nil {
				return o.opFail(prev, err)
			}
			switch {
			case keep != nil:
			case k < n-2:
				o.s.handOff(next, raw) // decoded: the writer recycles it
			default:
				o.release(raw)
			}
		}
	}
	return nil
}

// directReduce runs the two-phase schedule: every chunk goes straight to the
// owner of its segment (rank s owns segment s), the owner reduces in rank
// order and encodes once, then sends its bytes to every peer; every peer
// (the owner too) decodes them. With uneven segments it is the
// bandwidth-proportional schedule.
func directReduce(o *op, l *layout, ops directOps, sub int) error {
	w, r := o.s.w, o.s.rank
	rs, ag := subPhase(PhaseReduce, sub), subPhase(PhaseGather, sub)
	a, b := l.seg(r)
	o.begin((w-1)*(b-a) + len(l.chunks) - (b - a))
	for d := 1; d < w; d++ {
		j := (r + d) % w
		a, b := l.seg(j)
		for i := a; i < b; i++ {
			c := l.chunks[i]
			f, err := ops.contrib(o.newFrame(ops.maxLen(c.n)), c)
			if err != nil {
				return o.opFail(-1, err)
			}
			if err := o.seal(f, rs, i); err != nil {
				return err
			}
			o.s.handOff(j, f)
		}
	}
	contribs := make([][]byte, w)
	raws := make([][]byte, w)
	for i := a; i < b; i++ {
		c := l.chunks[i]
		for j := 0; j < w; j++ {
			if j == r {
				continue
			}
			raw, p, err := o.recv(j, rs, i)
			if err != nil {
				return err
			}
			contribs[j], raws[j] = p, raw
		}
		f, err := ops.reduce(o.newFrame(ops.maxLen(c.n)), c, contribs)
		if err != nil {
			return o.opFail(-1, err)
		}
		for j, raw := range raws {
			if raw != nil {
				o.release(raw)
				contribs[j], raws[j] = nil, nil
			}
		}
		if err := o.seal(f, ag, i); err != nil {
			return err
		}
		for j := 0; j < w; j++ {
			if j != r {
				o.s.send(j, f)
			}
		}
		if err := ops.finish(c, f[HeaderSize:]); err != nil {
			return o.opFail(-1, err)
		}
	}
	for d := 1; d < w; d++ {
		j := (r + d) % w
		a, b := l.seg(j)
		for i := a; i < b; i++ {
			raw, p, err := o.recv(j, ag, i)
			if err != nil {
				return err
			}
			if err := ops.finish(l.chunks[i], p); err != nil {
				return o.opFail(j, err)
			}
			o.release(raw)
		}
	}
	return nil
}

// gatherAll sends every peer's encoding of every chunk around the ring
// (chunk id = origin·chunks + index) and combines them in rank order.
func gatherAll(o *op, l *layout, ops gatherOps) error {
	w, r := o.s.w, o.s.rank
	ag := subPhase(PhaseGather, 0)
	next, prev := (r+1)%w, (r+w-1)%w
	n := len(l.chunks)
	payloads := make([][]byte, w*n)
	o.begin((w - 1) * n)
	for i, c := range l.chunks {
		f, err := ops.local(o.newFrame(ops.maxLen(c.n)), c)
		if err != nil {
			return o.opFail(-1, err)
		}
		if err := o.seal(f, ag, r*n+i); err != nil {
			return err
		}
		if w > 1 {
			o.s.send(next, f)
		}
		payloads[r*n+i] = f[HeaderSize:]
	}
	for k := 0; k < w-1; k++ {
		origin := (r - 1 - k + 2*w) % w
		for i := 0; i < n; i++ {
			raw, p, err := o.recv(prev, ag, origin*n+i)
			if err != nil {
				return err
			}
			if k < w-2 {
				o.s.send(next, raw)
			}
			payloads[origin*n+i] = p
		}
	}
	col := make([][]byte, w)
	for i, c := range l.chunks {
		for j := 0; j < w; j++ {
			col[j] = payloads[j*n+i]
		}
		if err := ops.combineAll(c, col); err != nil {
			return o.opFail(-1, err)
		}
	}
	return nil
}
