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

// ringReduce runs reduce-scatter then all-gather around the ring. Rank r
// owns segment r+1: it produces that segment's final bytes, which travel
// unchanged around the ring, and every peer (r too) decodes them.
func ringReduce(o *op, l *layout, ops ringOps, sub int) error {
	w, r := o.s.w, o.s.rank
	rs, ag := subPhase(PhaseReduce, sub), subPhase(PhaseGather, sub)
	next, prev := (r+1)%w, (r+w-1)%w
	o.begin(2 * len(l.chunks))
	a, b := l.seg(r)
	for i := a; i < b; i++ {
		c := l.chunks[i]
		f, err := ops.local(o.newFrame(ops.maxLen(c.n)), c)
		if err != nil {
			return o.opFail(-1, err)
		}
		if err := o.seal(f, rs, i); err != nil {
			return err
		}
		o.s.send(next, f)
	}
	for k := 0; k < w-1; k++ {
		seg := (r - k - 1 + 2*w) % w
		last := k == w-2
		a, b := l.seg(seg)
		for i := a; i < b; i++ {
			c := l.chunks[i]
			_, p, err := o.recv(prev, rs, i)
			if err != nil {
				return err
			}
			f, err := ops.combine(o.newFrame(ops.maxLen(c.n)), c, p, k+1, last)
			if err != nil {
				return o.opFail(prev, err)
			}
			ph := rs
			if last {
				ph = ag
			}
			if err := o.seal(f, ph, i); err != nil {
				return err
			}
			o.s.send(next, f)
			if last {
				if err := ops.finish(c, f[HeaderSize:]); err != nil {
					return o.opFail(-1, err)
				}
			}
		}
	}
	for k := 0; k < w-1; k++ {
		seg := (r - k + w) % w
		a, b := l.seg(seg)
		for i := a; i < b; i++ {
			raw, p, err := o.recv(prev, ag, i)
			if err != nil {
				return err
			}
			if k < w-2 {
				o.s.send(next, raw)
			}
			if err := ops.finish(l.chunks[i], p); err != nil {
				return o.opFail(prev, err)
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
			o.s.send(j, f)
		}
	}
	contribs := make([][]byte, w)
	for i := a; i < b; i++ {
		c := l.chunks[i]
		for j := 0; j < w; j++ {
			if j == r {
				continue
			}
			_, p, err := o.recv(j, rs, i)
			if err != nil {
				return err
			}
			contribs[j] = p
		}
		f, err := ops.reduce(o.newFrame(ops.maxLen(c.n)), c, contribs)
		if err != nil {
			return o.opFail(-1, err)
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
			_, p, err := o.recv(j, ag, i)
			if err != nil {
				return err
			}
			if err := ops.finish(l.chunks[i], p); err != nil {
				return o.opFail(j, err)
			}
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
