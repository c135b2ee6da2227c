package model

import (
	"encoding/binary"
	"fmt"
)

// CutState returns the state of st, a stage of whole's network
// (NewStage of the same model and configuration), cut from c, a
// checkpoint of whole: each of st's tensors takes the parameters and the
// optimizer moments of whole's tensor with the same initialisation key (a
// tied head's copy of the token table takes the table's). A pipeline that
// starts from the stages' cuts of one whole state continues the run that
// state belongs to: the two sides of the shared table hold its values and
// moments, as the summed gradients keep them (docs/pipeline.md).
func CutState(whole, st *Model, c *Checkpoint) (*Checkpoint, error) {
	if len(c.Params) != 4*len(whole.params) {
		return nil, fmt.Errorf("model: cutting a stage from a state of %d parameter bytes: %w: the whole model has %d", len(c.Params), ErrBadState, 4*len(whole.params))
	}
	if whole.name != st.name || whole.lo != 0 || whole.hi != whole.total || st.total != whole.total {
		return nil, fmt.Errorf("model: cutting %s stage [%d, %d) of %d layers from %s [%d, %d) of %d: not a stage of that whole model",
			st.name, st.lo, st.hi, st.total, whole.name, whole.lo, whole.hi, whole.total)
	}
	from := map[int][2]int{} // key → offset, length in whole's flat vectors
	for _, b := range whole.buckets {
		for _, t := range b.Tensors {
			if _, dup := from[t.key]; !dup {
				from[t.key] = [2]int{b.Offset + t.Offset, t.Len}
			}
		}
	}
	name, n, moments, err := parseOptState(c.Optimizer)
	if err != nil {
		return nil, err
	}
	if c.Optimizer != nil && n != len(whole.params) {
		return nil, fmt.Errorf("model: cutting a stage: %w: the optimizer state covers %d parameters, the whole model has %d", ErrBadState, n, len(whole.params))
	}
	out := &Checkpoint{Step: c.Step, ConfigHash: c.ConfigHash, Params: make([]byte, 4*len(st.params))}
	cut := make([][]float32, len(moments))
	for k := range cut {
		cut[k] = make([]float32, len(st.params))
	}
	for _, b := range st.buckets {
		for _, t := range b.Tensors {
			src, ok := from[t.key]
			if !ok || src[1] != t.Len {
				return nil, fmt.Errorf("model: cutting %s stage [%d, %d): tensor %s (%d values) has no counterpart in the whole model", st.name, st.lo, st.hi, t.Name, t.Len)
			}
			dst := b.Offset + t.Offset
			copy(out.Params[4*dst:4*(dst+t.Len)], c.Params[4*src[0]:4*(src[0]+t.Len)])
			for k, m := range moments {
				copy(cut[k][dst:dst+t.Len], m[src[0]:src[0]+t.Len])
			}
		}
	}
	if c.Optimizer != nil {
		out.Optimizer = optState(name, len(st.params), cut)
	}
	return out, nil
}

// parseOptState splits an optimizer state (Optimizer.State) into the
// optimizer's name, the parameters it covers and its moment vectors (0, 1
// or 2 of that length). A nil state has none.
func parseOptState(b []byte) (name string, n int, moments [][]float32, err error) {
	if b == nil {
		return "", 0, nil, nil
	}
	if len(b) < len(optMagic)+1 || string(b[:len(optMagic)]) != optMagic {
		return "", 0, nil, fmt.Errorf("%w: optimizer state lacks its magic", ErrBadState)
	}
	b = b[len(optMagic):]
	nl := int(b[0])
	b = b[1:]
	if len(b) < nl+8 {
		return "", 0, nil, fmt.Errorf("%w: optimizer state truncated", ErrBadState)
	}
	name, b = string(b[:nl]), b[nl:]
	n64 := binary.LittleEndian.Uint64(b)
	b = b[8:]
	floats := len(b) / 4
	if n64 > 1<<40 || len(b)%4 != 0 || (floats > 0 && (n64 == 0 || uint64(floats)%n64 != 0 || uint64(floats)/n64 > 2)) {
		return "", 0, nil, fmt.Errorf("%w: optimizer state of %d bytes of moments for %d parameters", ErrBadState, len(b), n64)
	}
	n = int(n64)
	for k := 0; k*n < floats; k++ {
		m := make([]float32, n)
		BytesToFloats(m, b[4*k*n:4*(k+1)*n])
		moments = append(moments, m)
	}
	return name, n, moments, nil
}

// optState encodes an optimizer state as Optimizer.State does.
func optState(name string, n int, moments [][]float32) []byte {
	b := make([]byte, 0, len(optMagic)+1+len(name)+8+4*n*len(moments))
	b = append(b, optMagic...)
	b = append(b, byte(len(name)))
	b = append(b, name...)
	b = binary.LittleEndian.AppendUint64(b, uint64(n))
	for _, m := range moments {
		b = append(b, FloatBytes(m)...)
	}
	return b
}

// JoinStates returns the state of whole joined from cps, the states of
// stages, the stages of whole's network (NewStage of the same model and
// configuration) in order, covering its layers: each of whole's tensors
// takes the parameters and optimizer moments of the first stage tensor
// with the same initialisation key (the token table's, not the tied
// head's copy of it, which the summed gradients keep equal). It is
// CutState's inverse: a pipeline's stages, all at one step, continue as
// the whole model. The joined state carries no ConfigHash.
func JoinStates(whole *Model, stages []*Model, cps []*Checkpoint) (*Checkpoint, error) {
	if whole.lo != 0 || whole.hi != whole.total {
		return nil, fmt.Errorf("model: joining stages into %s [%d, %d) of %d layers: not a whole model", whole.name, whole.lo, whole.hi, whole.total)
	}
	if len(stages) == 0 || len(stages) != len(cps) {
		return nil, fmt.Errorf("model: joining %d stages with %d states", len(stages), len(cps))
	}
	to := map[int][2]int{} // key → offset, length in whole's flat vectors
	for _, b := range whole.buckets {
		for _, t := range b.Tensors {
			if _, dup := to[t.key]; !dup {
				to[t.key] = [2]int{b.Offset + t.Offset, t.Len}
			}
		}
	}
	out := &Checkpoint{Step: cps[0].Step, Params: make([]byte, 4*len(whole.params))}
	filled := map[int]bool{}
	var joined [][]float32
	optName, hasOpt := "", cps[0].Optimizer != nil
	next := 0
	for k, st := range stages {
		c := cps[k]
		switch {
		case st.name != whole.name || st.total != whole.total || st.lo != next:
			return nil, fmt.Errorf("model: joining %s stage %d [%d, %d) of %d layers into %s of %d: the stages must cover its layers in order",
				st.name, k, st.lo, st.hi, st.total, whole.name, whole.total)
		case c.Step != out.Step:
			return nil, fmt.Errorf("model: joining stage %d's state of step %d with one of step %d: %w", k, c.Step, out.Step, ErrBadState)
		case len(c.Params) != 4*len(st.params):
			return nil, fmt.Errorf("model: joining stage %d: a state of %d parameter bytes: %w: the stage has %d", k, len(c.Params), ErrBadState, 4*len(st.params))
		case (c.Optimizer != nil) != hasOpt:
			return nil, fmt.Errorf("model: joining stage %d: %w: an optimizer state in some stages' states only", k, ErrBadState)
		}
		next = st.hi
		name, n, moments, err := parseOptState(c.Optimizer)
		if err != nil {
			return nil, fmt.Errorf("model: joining stage %d: %w", k, err)
		}
		if hasOpt {
			switch {
			case n != len(st.params):
				return nil, fmt.Errorf("model: joining stage %d: %w: the optimizer state covers %d parameters, the stage has %d", k, ErrBadState, n, len(st.params))
			case k == 0:
				optName = name
				for range moments {
					joined = append(joined, make([]float32, len(whole.params)))
				}
			case name != optName || len(moments) != len(joined):
				return nil, fmt.Errorf("model: joining stage %d: %w: optimizer %s with %d moments after %s with %d", k, ErrBadState, name, len(moments), optName, len(joined))
			}
		}
		for _, b := range st.buckets {
			for _, t := range b.Tensors {
				dst, ok := to[t.key]
				if !ok || dst[1] != t.Len {
					return nil, fmt.Errorf("model: joining %s stage [%d, %d): tensor %s (%d values) has no counterpart in the whole model", st.name, st.lo, st.hi, t.Name, t.Len)
				}
				if filled[t.key] {
					continue // the head's copy of the token table
				}
				filled[t.key] = true
				src := b.Offset + t.Offset
				copy(out.Params[4*dst[0]:4*(dst[0]+t.Len)], c.Params[4*src:4*(src+t.Len)])
				for m, v := range moments {
					copy(joined[m][dst[0]:dst[0]+t.Len], v[src:src+t.Len])
				}
			}
		}
	}
	if next != whole.total || len(filled) != len(to) {
		return nil, fmt.Errorf("model: joining stages into %s: they cover %d of its %d layers and %d of its %d tensors", whole.name, next, whole.total, len(filled), len(to))
	}
	if hasOpt {
		out.Optimizer = optState(optName, len(whole.params), joined)
	}
	return out, nil
}
