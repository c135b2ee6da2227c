package pipeline

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/model"
)

// EvalStatsBytes is the payload size of an EvalStats message: the mean
// loss per label (float64 bits), the labels predicted right and the labels
// counted (uint64 each), little-endian.
const EvalStatsBytes = 24

// evalWindow is how many rounds of an evaluation may be in flight: a stage
// starts round r once round r−evalWindow's figures have come back to it.
// A stage then holds at most evalWindow rounds of its predecessor's
// activations, and waits for any one message about evalWindow rounds of
// the slowest stage's forward passes at most, however large the held-out
// set.
const evalWindow = 2

// evalSeed seeds the codecs that encode an evaluation's activations, alike
// on every peer: two pipelines with the same parameters send the same
// bytes, and so report the same figures, even with a stochastic codec.
const evalSeed = 0x6576616c

// EvalChunks returns the number of chunks Stage.Evaluate cuts n held-out
// samples into on stages of at most maxBatch samples (0 when either is not
// positive).
func EvalChunks(n, maxBatch int) int {
	if n <= 0 || maxBatch <= 0 {
		return 0
	}
	return (n + maxBatch - 1) / maxBatch
}

// EvalRounds returns the number of rounds of micro chunks each that
// Stage.Evaluate sends chunks chunks in (0 when either is not positive).
func EvalRounds(chunks, micro int) int { return EvalChunks(chunks, micro) }

// evalPos is the compress.Pos of an evaluation's chunk j: a stream that no
// step's message uses (Pos keeps the top bit clear).
func evalPos(step uint64, j int) compress.Pos {
	return compress.Pos{Step: step, Stream: 1<<31 | uint32(j)}
}

// Evaluate runs the held-out set ds forward through the pipeline, without
// a backward pass or any change to the parameters, and returns the loss
// statistics the last stage computes over the whole set: every stage of
// the pipeline returns the same figures, bit for bit.
//
// ds is cut into chunks of the stage model's MaxBatch samples, in order
// (EvalChunks); the first stage reads their inputs, the last their labels,
// the stages between only ds.Len(). A chunk's activations go to the next
// stage as an EvalActivation message (Key.Micro the chunk's index),
// encoded with the activation codec seeded alike on every peer. The chunks
// go in rounds of Config.Micro; after each round the last stage sends the
// figures so far back stage by stage as an EvalStats message (Key.Micro
// the round's index), and a stage starts round r once round r−2's figures
// reached it, so that no stage runs more than two rounds ahead of the
// last. Each stage checks the figures it receives against the labels the
// rounds so far hold. Messages are named by step, which the transport must
// accept (the step the stage works on, or the next). A failed send or
// receive, or ctx ending, fails the evaluation; the transport then holds
// messages of it and must be reset, as after a failed step.
func (st *Stage) Evaluate(ctx context.Context, step uint64, ds model.Samples) (model.Stats, error) {
	n, mb := ds.Len(), st.m.MaxBatch()
	chunks := EvalChunks(n, mb)
	if chunks == 0 {
		return model.Stats{}, fmt.Errorf("pipeline: stage %d: evaluating %d samples in chunks of %d", st.cfg.Stage, n, mb)
	}
	if st.first && ds.SampleLen() != st.inEl {
		return model.Stats{}, fmt.Errorf("pipeline: first stage: held-out samples of %d values, the model takes %d", ds.SampleLen(), st.inEl)
	}
	if !st.last && st.evalOut == nil {
		c, err := newCodec(st.cfg.Codec, mb*st.outEl, evalSeed)
		if err != nil {
			return model.Stats{}, err
		}
		st.evalOut = c
	}
	M := st.cfg.Micro
	rounds := EvalRounds(chunks, M)
	// labels returns the labels of the rounds up to r.
	labels := func(r int) int { return min((r+1)*M*mb, n) * st.m.LabelsPerSample() }
	var acc, figures model.Stats
	var err error
	for r := range rounds {
		if !st.last && r >= evalWindow {
			if figures, err = st.evalBack(ctx, step, r-evalWindow, model.Stats{}, labels(r-evalWindow)); err != nil {
				return model.Stats{}, err
			}
		}
		for j := r * M; j < min((r+1)*M, chunks); j++ {
			lo, hi := j*mb, min((j+1)*mb, n)
			in := model.StageInput{N: hi - lo}
			var b model.Batch
			if st.first || st.last {
				b = ds.Slice(lo, hi)
			}
			if st.first {
				in.X = b.X
			} else {
				st.evalIn = grow(st.evalIn, in.N*st.inEl)
				if in.X, err = st.recv(ctx, Key{step, j, EvalActivation}, st.ins, st.evalIn); err != nil {
					return model.Stats{}, err
				}
			}
			if st.last {
				in.Y = b.Y
			}
			s, err := st.forward(in)
			if err != nil {
				return model.Stats{}, fmt.Errorf("pipeline: stage %d evaluating chunk %d (samples %d to %d): %w", st.cfg.Stage, j, lo, hi, err)
			}
			if st.last {
				acc.Add(s)
				continue
			}
			if err := st.send(ctx, Key{step, j, EvalActivation}, st.evalOut, st.tag(len(st.outs)-1), st.y, evalPos(step, j)); err != nil {
				return model.Stats{}, err
			}
		}
		if st.last {
			if figures, err = st.evalBack(ctx, step, r, acc, labels(r)); err != nil {
				return model.Stats{}, err
			}
		}
	}
	for r := max(rounds-evalWindow, 0); r < rounds && !st.last; r++ {
		if figures, err = st.evalBack(ctx, step, r, model.Stats{}, labels(r)); err != nil {
			return model.Stats{}, err
		}
	}
	return figures, nil
}

// evalBack passes round r's figures back: the last stage sends its own
// (own), the others receive them from the next stage, check that they
// count want labels, and pass them on to the previous stage (the first
// keeps them). It returns the figures.
func (st *Stage) evalBack(ctx context.Context, step uint64, r int, own model.Stats, want int) (model.Stats, error) {
	k := Key{Step: step, Micro: r, Kind: EvalStats}
	figures := own
	if !st.last {
		p, err := st.t.Recv(ctx, k)
		if err != nil {
			return model.Stats{}, fmt.Errorf("pipeline: stage %d receiving %v: %w", st.cfg.Stage, k, err)
		}
		if figures, err = DecodeEvalStats(p, want); err != nil {
			return model.Stats{}, fmt.Errorf("pipeline: stage %d: %v: %w", st.cfg.Stage, k, err)
		}
	}
	if st.first {
		return figures, nil
	}
	var b [EvalStatsBytes]byte
	if err := st.t.Send(ctx, k, AppendEvalStats(b[:0], figures)); err != nil {
		return model.Stats{}, fmt.Errorf("pipeline: stage %d sending %v: %w", st.cfg.Stage, k, err)
	}
	return figures, nil
}

// AppendEvalStats appends s as an EvalStats payload.
func AppendEvalStats(b []byte, s model.Stats) []byte {
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Loss))
	b = binary.LittleEndian.AppendUint64(b, uint64(s.Correct))
	return binary.LittleEndian.AppendUint64(b, uint64(s.Samples))
}

// DecodeEvalStats decodes an EvalStats payload that must count want
// labels, with no more right than counted.
func DecodeEvalStats(p []byte, want int) (model.Stats, error) {
	if len(p) != EvalStatsBytes {
		return model.Stats{}, fmt.Errorf("eval stats of %d bytes, want %d", len(p), EvalStatsBytes)
	}
	loss := math.Float64frombits(binary.LittleEndian.Uint64(p))
	correct, samples := binary.LittleEndian.Uint64(p[8:]), binary.LittleEndian.Uint64(p[16:])
	if correct > samples || samples != uint64(want) {
		return model.Stats{}, fmt.Errorf("eval stats counting %d labels, %d right; want %d labels", samples, correct, want)
	}
	return model.Stats{Loss: loss, Correct: int(correct), Samples: int(samples)}, nil
}
