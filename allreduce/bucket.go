package allreduce

import (
	"context"
	"fmt"

	"github.com/p2ptrain/p2ptrain/compress"
)

// scheduleFor resolves the schedule of a codec class.
func (s *Session) scheduleFor(class compress.Class) Schedule {
	sch := s.cfg.Schedule
	if sch.Hierarchical() && class != compress.ClassLinear {
		sch = ScheduleAuto // the hierarchical schedule carries linear codecs only
	}
	if s.cfg.Robust.Enabled() && robustClass(class) {
		// Clipping needs every member's contribution at the owner.
		if sch == ScheduleProportional {
			return sch
		}
		return ScheduleDirect
	}
	switch class {
	case compress.ClassSparse:
		return ScheduleAllGather
	case compress.ClassErrorFeedback:
		if sch == ScheduleAllGather || sch == ScheduleProportional {
			return sch
		}
		return ScheduleDirect
	case compress.ClassQuantized:
		if sch == ScheduleAuto || sch == ScheduleAllGather {
			return ScheduleDirect
		}
		return sch
	default:
		if sch == ScheduleAuto || sch == ScheduleAllGather {
			return ScheduleRing
		}
		return sch
	}
}

// robustClass reports whether robust aggregation can combine a class: the
// owner must be able to decode each member's contribution alone.
func robustClass(c compress.Class) bool {
	return c == compress.ClassLinear || c == compress.ClassQuantized || c == compress.ClassErrorFeedback
}

// ScheduleFor returns the schedule the session uses for a codec class.
func (s *Session) ScheduleFor(class compress.Class) Schedule { return s.scheduleFor(class) }

func (s *Session) chunkElems() int { return s.cfg.ChunkBytes / 4 }

func (s *Session) sharesFor(sch Schedule) []float64 {
	if sch == ScheduleProportional {
		return s.cfg.Shares
	}
	return nil
}

// run dispatches a linear-style reduce (ring or direct) over layout l.
func run(o *op, sch Schedule, l *layout, ops interface {
	ringOps
	directOps
}, sub int) error {
	if sch == ScheduleRing && o.s.w > 1 {
		return ringReduce(o, l, ops, sub)
	}
	return directReduce(o, l, ops, sub)
}

// reduceBucket all-reduces one bucket into out (scratch).
func (s *Session) reduceBucket(ctx context.Context, step uint64, b Bucket, out []float32) error {
	if err := s.errNow(); err != nil {
		return err
	}
	if s.w == 1 {
		// A ring of one averages nothing: the gradient is its own average.
		// No codec runs (it could only add error) and nothing is framed.
		copy(out, b.Data)
		return nil
	}
	n := len(b.Data)
	o := &op{s: s, ctx: ctx, step: step, bucket: b.ID, timeout: s.cfg.frameTimeout(4 * n), id: CodecID(b.Codec.Spec())}
	defer s.dropBoxes(step, b.ID)
	bctx := &bucketCtx{step: step, w: s.w, rank: s.rank, data: b.Data, out: out, codec: b.Codec, pool: &s.floats}
	defer bctx.release()
	class := b.Codec.Class()
	sch := s.scheduleFor(class)
	shares := s.sharesFor(sch)
	chunk, minElems := chunkBounds(b.Codec, s.chunkElems(), sch, b.Links != nil)

	checkFrame := func(elems int) error {
		if m := HeaderSize + b.Codec.MaxEncodedLen(elems); m > s.max {
			return o.failLocal(fmt.Errorf("%w: bucket %d (%s): a chunk of %d values may encode to %d bytes > max frame %d",
				ErrConfig, b.ID, b.Codec.Spec(), elems, m, s.max))
		}
		return nil
	}

	if s.cfg.Robust.Enabled() && !robustClass(class) {
		return o.failLocal(fmt.Errorf("%w: bucket %d: robust aggregation cannot combine codec %s (%v)", ErrConfig, b.ID, b.Codec.Spec(), class))
	}
	switch class {
	case compress.ClassLinear, compress.ClassQuantized:
		l := makeLayout(n, s.w, 1, chunk, minElems, shares)
		if err := checkFrame(min(chunk, max(n, 1))); err != nil {
			return err
		}
		ops := &codecOps{bucketCtx: bctx, robust: s.robustFor(n)}
		if sch.Hierarchical() {
			return hierReduce(o, s.hier, n, ops)
		}
		if lk := b.Links; lk != nil && sch == ScheduleRing && s.w > 1 {
			if lk.Final != nil {
				bctx.codec = lk.Final
				o.id = CodecID(lk.Final.Spec())
			}
			ops.sendC, ops.recvC = lk.Send, lk.Recv
			o.sendID, o.recvID = CodecID(lk.Send.Spec()), CodecID(lk.Recv.Spec())
			for _, cd := range []compress.Codec{lk.Send, lk.Recv} {
				if cd.Class() != compress.ClassLinear && cd.Class() != compress.ClassQuantized {
					return o.failLocal(fmt.Errorf("%w: bucket %d: link codec %s of class %v", ErrConfig, b.ID, cd.Spec(), cd.Class()))
				}
			}
		}
		return run(o, sch, &l, ops, 0)

	case compress.ClassErrorFeedback, compress.ClassSparse:
		l := makeLayout(n, s.w, 1, chunk, minElems, shares)
		if err := checkFrame(min(chunk, max(n, 1))); err != nil {
			return err
		}
		ops := &codecOps{bucketCtx: bctx, feedback: true, robust: s.robustFor(n)}
		if sch == ScheduleAllGather {
			return gatherAll(o, &l, ops)
		}
		return directReduce(o, &l, ops, 0)

	case compress.ClassSharedScale:
		ss, ok := b.Codec.(compress.SharedScaler)
		if !ok {
			return o.failLocal(fmt.Errorf("%w: bucket %d: codec %s is shared-scale but not a SharedScaler", ErrConfig, b.ID, b.Codec.Spec()))
		}
		gran := ss.Block()
		if gran < 1 {
			gran = 1
		}
		nScales := ss.NumScales(n)
		local := make([]float32, nScales)
		ss.Scales(local, b.Data)
		absmax := make([]float32, nScales)
		scaleLayout := makeLayout(nScales, s.w, 1, s.chunkElems(), minChunkElems, shares)
		// The scales are few (one per block) and the data waits for them:
		// the direct schedule takes 2 hops where the ring takes 2(W−1),
		// for the same bytes (MAX is exact in any order).
		if err := run(o, ScheduleDirect, &scaleLayout, &rawOps{bucketCtx: &bucketCtx{step: step, w: s.w, rank: s.rank, data: local, out: absmax}, max: true}, 1); err != nil {
			return err
		}
		scaledChunk := max(gran, chunk-chunk%gran)
		l := makeLayout(n, s.w, gran, scaledChunk, minElems, shares)
		if err := checkFrame(min(scaledChunk, max(n, 1))); err != nil {
			return err
		}
		return run(o, sch, &l, &scaleOps{bucketCtx: bctx, ss: ss, absmax: absmax, gran: gran}, 0)

	case compress.ClassLowRank:
		lr, ok := b.Codec.(compress.LowRank)
		if !ok {
			return o.failLocal(fmt.Errorf("%w: bucket %d: codec %s is low-rank but not a LowRank", ErrConfig, b.ID, b.Codec.Spec()))
		}
		rounds := lr.Rounds()
		if rounds > 15 {
			return o.failLocal(fmt.Errorf("%w: bucket %d: %d low-rank rounds > 15", ErrConfig, b.ID, rounds))
		}
		in := b.Data
		for round := 0; round < rounds; round++ {
			f, err := lr.Factor(round, step, in)
			if err != nil {
				return o.failLocal(fmt.Errorf("low-rank factor round %d: %w", round, err))
			}
			in = nil
			sum := make([]float32, len(f))
			factorLayout := makeLayout(len(f), s.w, 1, chunk, minElems, shares)
			ops := &rawOps{bucketCtx: &bucketCtx{step: step, w: s.w, rank: s.rank, data: f, out: sum}}
			factorSched := sch
			if factorSched != ScheduleProportional && factorSched != ScheduleDirect {
				factorSched = ScheduleRing
			}
			if err := run(o, factorSched, &factorLayout, ops, round); err != nil {
				return err
			}
			if err := lr.Absorb(round, sum, s.w, out); err != nil {
				return o.failLocal(fmt.Errorf("low-rank absorb round %d: %w", round, err))
			}
		}
		return nil
	}
	return o.failLocal(fmt.Errorf("%w: bucket %d: unknown codec class %v", ErrConfig, b.ID, class))
}
