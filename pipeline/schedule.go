package pipeline

import (
	"fmt"
	"strings"
)

// Schedule orders a stage's forward and backward passes over a step's
// micro-batches. Both schedules run the backward passes in micro-batch
// order 0, 1, …, M−1, so they accumulate the same gradients in the same
// order: their results are bit-identical. A layer keeps the saved state of
// one forward pass only, so a backward pass whose micro-batch is not the
// latest forward pass runs that forward pass again first (Op.Recompute)
// from the stage's input, which the stage keeps until the backward pass.
type Schedule int

const (
	// OneFOneB runs stage s's first S−s−1 forward passes, then alternates
	// one forward and one backward pass, then the remaining backward
	// passes. A stage keeps at most S−s inputs, and the last stage never
	// recomputes (each forward pass is followed by its backward pass).
	OneFOneB Schedule = iota
	// GPipe runs every forward pass, then every backward pass. A stage
	// keeps all M inputs and recomputes every forward pass when M > 1.
	GPipe
)

// String returns the schedule's name as ParseSchedule reads it.
func (sc Schedule) String() string {
	switch sc {
	case OneFOneB:
		return "1f1b"
	case GPipe:
		return "gpipe"
	}
	return fmt.Sprintf("Schedule(%d)", int(sc))
}

// ParseSchedule reads "1f1b" or "gpipe".
func ParseSchedule(s string) (Schedule, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1f1b":
		return OneFOneB, nil
	case "gpipe":
		return GPipe, nil
	}
	return 0, fmt.Errorf("pipeline: unknown schedule %q (want 1f1b or gpipe)", s)
}

// OpKind is a forward or a backward pass.
type OpKind uint8

const (
	// Forward runs a micro-batch through the stage (and sends its output on).
	Forward OpKind = iota
	// Backward runs a micro-batch's backward pass through the stage (and
	// sends its input gradient back).
	Backward
)

// Op is one operation of a stage's schedule.
type Op struct {
	Kind  OpKind
	Micro int
	// Recompute, for a backward pass, says that another forward pass ran
	// since the micro-batch's own: the stage runs it again first.
	Recompute bool
}

// String writes the op as F3, B3 or B3* (recomputed).
func (op Op) String() string {
	s := fmt.Sprintf("F%d", op.Micro)
	if op.Kind == Backward {
		s = fmt.Sprintf("B%d", op.Micro)
		if op.Recompute {
			s += "*"
		}
	}
	return s
}

// Ops returns stage s's operations, of stages stages, over micro
// micro-batches.
func (sc Schedule) Ops(stages, s, micro int) ([]Op, error) {
	if stages < 1 || s < 0 || s >= stages || micro < 1 {
		return nil, fmt.Errorf("pipeline: no schedule for stage %d of %d over %d micro-batches", s, stages, micro)
	}
	ops := make([]Op, 0, 2*micro)
	f := func(j int) { ops = append(ops, Op{Kind: Forward, Micro: j}) }
	b := func(j int) { ops = append(ops, Op{Kind: Backward, Micro: j}) }
	switch sc {
	case GPipe:
		for j := range micro {
			f(j)
		}
		for j := range micro {
			b(j)
		}
	case OneFOneB:
		warm := min(stages-s-1, micro)
		for j := range warm {
			f(j)
		}
		for j := range micro - warm {
			f(warm + j)
			b(j)
		}
		for j := micro - warm; j < micro; j++ {
			b(j)
		}
	default:
		return nil, fmt.Errorf("pipeline: unknown schedule %v", sc)
	}
	live := -1 // the micro-batch whose forward state the layers hold
	for i := range ops {
		if ops[i].Kind == Forward {
			live = ops[i].Micro
			continue
		}
		ops[i].Recompute = live != ops[i].Micro
		live = ops[i].Micro
	}
	return ops, nil
}

// Timing is what Simulate takes, in seconds: per stage, one micro-batch's
// forward and backward compute time; per hop h (stage h to h+1), the time
// one micro-batch's activation, or its gradient, occupies the link; and a
// one-way latency per message.
type Timing struct {
	Forward, Backward []float64
	Transfer          []float64
	Latency           float64
	// Message, when not nil, is per hop the processor time each end
	// spends on one of its messages (the sender encoding and sending it,
	// the receiver receiving and decoding it), on the stage's own
	// processor: a forward pass of stage s takes hop s−1's after its
	// activation arrives and hop s's to send its output, a backward pass
	// the same for the gradients, and a recomputation neither.
	Message []float64
	// TransferBack and MessageBack, when not nil, are Transfer and Message
	// of the hops' activation gradients where they differ from their
	// activations' (a codec per link and direction); nil: the same.
	TransferBack, MessageBack []float64
}

// message returns hop h's per-end processor time of a message forward
// (back: of a gradient), 0 for a hop that does not exist or without
// Message.
func (t Timing) message(h int, back bool) float64 {
	m := t.Message
	if back && t.MessageBack != nil {
		m = t.MessageBack
	}
	if h < 0 || h >= len(m) {
		return 0
	}
	return m[h]
}

// transfer returns hop h's transfer time of a message forward (back: of a
// gradient).
func (t Timing) transfer(h int, back bool) float64 {
	if back && t.TransferBack != nil {
		return t.TransferBack[h]
	}
	return t.Transfer[h]
}

// Simulate runs every stage's operations for micro micro-batches under t
// and returns when the last one ends: each stage runs its operations in
// order, each as soon as the stage is free and its input has arrived; a
// recomputed backward pass runs its forward pass again first, from the
// stage's own input, so that recomputation starts when the stage is free
// and only the backward pass waits for the gradient (as Stage.Step runs
// them: it receives the gradient after recomputing). A message takes
// its hop's Transfer on the link, one message at a time per direction in
// the order sent, and arrives Latency after leaving it.
func (sc Schedule) Simulate(t Timing, micro int) (float64, error) {
	S := len(t.Forward)
	if S == 0 || len(t.Backward) != S || len(t.Transfer) != S-1 || t.Message != nil && len(t.Message) != S-1 ||
		t.TransferBack != nil && len(t.TransferBack) != S-1 || t.MessageBack != nil && len(t.MessageBack) != S-1 {
		return 0, fmt.Errorf("pipeline: timing for %d forward, %d backward stages, %d hops, %d hops' message times, %d and %d of their gradients",
			len(t.Forward), len(t.Backward), len(t.Transfer), len(t.Message), len(t.TransferBack), len(t.MessageBack))
	}
	ops := make([][]Op, S)
	for s := range S {
		var err error
		if ops[s], err = sc.Ops(S, s, micro); err != nil {
			return 0, err
		}
	}
	unknown := -1.0
	// act[s][j]: when micro-batch j's activation reaches stage s; grad[s][j]:
	// when its output gradient reaches stage s.
	act, grad := make([][]float64, S), make([][]float64, S)
	for s := range S {
		act[s], grad[s] = make([]float64, micro), make([]float64, micro)
		for j := range micro {
			act[s][j], grad[s][j] = unknown, unknown
			if s == 0 {
				act[s][j] = 0
			}
			if s == S-1 {
				grad[s][j] = 0
			}
		}
	}
	free := make([]float64, S)
	fwdLink, bwdLink := make([]float64, S), make([]float64, S)
	next := make([]int, S)
	send := func(link *float64, h int, back bool, at float64) float64 {
		start := max(*link, at)
		*link = start + t.transfer(h, back)
		return *link + t.Latency
	}
	for done := 0; done < S*2*micro; {
		progress := false
		for s := range S {
			for next[s] < len(ops[s]) {
				op := ops[s][next[s]]
				// Every pass receives from one neighbour and sends to
				// the other (the ends of the pipeline one of them).
				ready, dur, start := act[s][op.Micro], t.Forward[s]+t.message(s-1, false)+t.message(s, false), free[s]
				if op.Kind == Backward {
					ready, dur = grad[s][op.Micro], t.Backward[s]+t.message(s-1, true)+t.message(s, true)
					if op.Recompute {
						// The recomputation needs only the stage's own
						// input: the stage runs it before it waits for
						// the gradient (Stage.Step).
						start += t.Forward[s]
					}
				}
				if ready == unknown {
					break
				}
				free[s] = max(start, ready) + dur
				switch {
				case op.Kind == Forward && s < S-1:
					act[s+1][op.Micro] = send(&fwdLink[s], s, false, free[s])
				case op.Kind == Backward && s > 0:
					grad[s-1][op.Micro] = send(&bwdLink[s-1], s-1, true, free[s])
				}
				next[s]++
				done++
				progress = true
			}
		}
		if !progress {
			return 0, fmt.Errorf("pipeline: schedule %v deadlocks with %d stages and %d micro-batches", sc, S, micro)
		}
	}
	end := 0.0
	for _, f := range free {
		end = max(end, f)
	}
	return end, nil
}
