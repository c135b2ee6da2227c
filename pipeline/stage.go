package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/model"
)

// Config configures one stage of a pipeline.
type Config struct {
	// Stages is the number of stages S; Stage is this one's index.
	Stages, Stage int
	// Micro is the number of micro-batches M a step's batch is cut into.
	Micro int
	// Schedule orders the micro-batches (default OneFOneB).
	Schedule Schedule
	// Codec encodes the activations and their gradients (a spec that
	// ValidateCodec accepts; "" is DefaultCodec). Every stage of a pipeline
	// must use the same.
	Codec string
	// Seed seeds stochastic codecs (qsgd); use a different one per stage.
	Seed uint64
	// LinkCodecs lets the stage choose the codec of each step's messages
	// per link among Ladder(Codec) (train.activation_link_codecs = "auto",
	// docs/pipeline.md): the most exact one whose extra bytes over Codec's
	// cost the link at most linkBudget of the stage's compute. Every stage of a pipeline must
	// set it alike: each message then starts with a byte naming its codec.
	LinkCodecs bool
	// Rates returns the measured rates, in bytes/s, of this stage's links
	// to the previous and to the next stage, which carry its activation
	// gradients and its activations (0: not measured; the link then
	// carries Codec). With LinkCodecs the stage calls it before each step,
	// so that a link measured during an epoch counts from the next step.
	// nil: no link is measured.
	Rates func() (in, out float64)
}

// Stage runs one pipeline stage's part of each step: its schedule's
// forward and backward passes over the micro-batches, on a model.Model
// that holds the stage's layers (model.NewStage), exchanging activations
// and their gradients with its neighbours through a Transport. A Stage is
// not safe for concurrent use.
type Stage struct {
	m     *model.Model
	t     Transport
	cfg   Config
	ops   []Op
	first bool
	last  bool
	inEl  int // input values per sample
	outEl int // output values per sample
	// ins encode the input gradients sent back and decode the activations
	// received; outs encode the activations sent on and decode the
	// gradients received: one codec of Ladder(Codec) each with LinkCodecs,
	// else just Codec's. inPick and outPick index the codec this step sends
	// with; inSizes and outSizes are each codec's bytes for a micro-batch.
	ins, outs         []compress.Codec
	inPick, outPick   int
	inSizes, outSizes []int
	// busy is the compute time of the step so far; compute the last
	// complete step's per micro-batch (0: none yet), which pickCodec
	// compares the links' transfers with.
	busy, compute time.Duration
	// inRate and outRate are the links' rates the last choice read.
	inRate, outRate float64
	// held[j] is micro-batch j's input (stages but the first), kept from
	// its forward pass to its backward pass; spare holds free buffers.
	held        [][]float32
	spare       [][]float32
	y, dy, dx   []float32
	enc         []byte
	tiedSum     []float32
	sent, recvd int64
	// evalIn holds an evaluation chunk's input (stages but the first);
	// evalOut encodes the evaluation's activations, seeded alike on every
	// peer (Evaluate).
	evalIn  []float32
	evalOut compress.Codec
}

// NewStage returns the runner of stage cfg.Stage of cfg.Stages over m,
// whose layer range must be a first stage exactly when cfg.Stage is 0 and
// a last stage exactly when it is S−1.
func NewStage(m *model.Model, t Transport, cfg Config) (*Stage, error) {
	if cfg.Codec == "" {
		cfg.Codec = DefaultCodec
	}
	ops, err := cfg.Schedule.Ops(cfg.Stages, cfg.Stage, cfg.Micro)
	if err != nil {
		return nil, err
	}
	lo, hi, total := m.StageRange()
	st := &Stage{m: m, t: t, cfg: cfg, ops: ops, first: lo == 0, last: hi == total,
		inEl: numel(m.StageInputShape()), outEl: numel(m.StageOutputShape())}
	if st.first != (cfg.Stage == 0) || st.last != (cfg.Stage == cfg.Stages-1) {
		return nil, fmt.Errorf("pipeline: stage %d of %d cannot run layers [%d, %d) of %d", cfg.Stage, cfg.Stages, lo, hi, total)
	}
	specs := []string{cfg.Codec}
	if cfg.LinkCodecs {
		if specs, err = Ladder(cfg.Codec); err != nil {
			return nil, err
		}
	}
	mb := m.MaxBatch()
	for _, spec := range specs {
		in, err := newCodec(spec, mb*st.inEl, cfg.Seed)
		if err != nil {
			return nil, err
		}
		out, err := newCodec(spec, mb*st.outEl, cfg.Seed^0x9e3779b97f4a7c15)
		if err != nil {
			return nil, err
		}
		st.ins, st.outs = append(st.ins, in), append(st.outs, out)
		st.inSizes, st.outSizes = append(st.inSizes, in.MaxEncodedLen(mb*st.inEl)), append(st.outSizes, out.MaxEncodedLen(mb*st.outEl))
	}
	st.inPick, st.outPick = len(specs)-1, len(specs)-1
	st.held = make([][]float32, cfg.Micro)
	return st, nil
}

// linkBudget is the share of a stage's compute that a more exact codec
// may add to a link's transfers: a link carries a codec more exact than
// the most compressed one only when the extra bytes of a micro-batch's
// message take at most this share of the stage's compute per micro-batch,
// so that exactness costs at most about this share of the step even when
// none of the transfer overlaps compute (fill and drain, the stage ring's
// traffic on the same link). The rule "the transfer hides under the
// compute" made a 2-stage gpt 1.33× slower at 20 Mbit/s (docs/pipeline.md).
const linkBudget = 0.05

// upgradeMargin is the share of the budget a more exact codec's extra
// transfer must fit in before a link moves to it: the hysteresis that
// keeps a link near the budget from switching codec every step.
const upgradeMargin = 0.8

// pickCodec returns the index, in a ladder of codecs from the most exact
// to the most compressed whose encoded bytes for one micro-batch are
// sizes, of the codec a link of rate bytes/s carries: the most exact one
// whose extra transfer time over the most compressed one is at most
// linkBudget of the stage's compute per micro-batch (upgradeMargin of
// that for one more exact than cur, the link's codec so far); the most
// compressed when none fits or the rate is not measured.
func pickCodec(sizes []int, rate float64, compute time.Duration, cur int) int {
	last := len(sizes) - 1
	if !(rate > 0) {
		return last
	}
	for i, b := range sizes[:last] {
		limit := linkBudget * compute.Seconds()
		if i < cur {
			limit *= upgradeMargin
		}
		if float64(b-sizes[last])/rate <= limit {
			return i
		}
	}
	return last
}

// LinkCodecs returns the codecs the stage sends its activations and its
// activation gradients with in its next step ("" for a side it sends
// nothing on: the last stage's activations, the first's gradients).
func (st *Stage) LinkCodecs() (activations, gradients string) {
	if !st.last {
		activations = st.outs[st.outPick].Spec()
	}
	if !st.first {
		gradients = st.ins[st.inPick].Spec()
	}
	return activations, gradients
}

// LinkRates returns the rates in bytes/s of the links to the previous and
// the next stage that the codecs of the last step were chosen by (0: not
// measured, or LinkCodecs off).
func (st *Stage) LinkRates() (in, out float64) { return st.inRate, st.outRate }

// choose picks the codecs of the step's messages on both links, from the
// last step's compute.
func (st *Stage) choose() {
	if len(st.outs) < 2 {
		return
	}
	if st.cfg.Rates != nil {
		st.inRate, st.outRate = st.cfg.Rates()
	}
	st.outPick = pickCodec(st.outSizes, st.outRate, st.compute, st.outPick)
	st.inPick = pickCodec(st.inSizes, st.inRate, st.compute, st.inPick)
}

// tag is the codec byte of a message sent with codec i of the ladder (-1:
// none, with a single codec).
func (st *Stage) tag(i int) int {
	if len(st.outs) < 2 {
		return -1
	}
	return i
}

// Model returns the stage's model (its parameters, gradients, buckets).
func (st *Stage) Model() *model.Model { return st.m }

// Result is what one stage's step computed.
type Result struct {
	// Stats is the loss over the step's batch (the last stage; zero on
	// the others).
	Stats model.Stats
	// Sent and Received count the message payload bytes of the step.
	Sent, Received int64
	// Recomputed counts the forward passes run again.
	Recomputed int
}

// MicroSizes cuts n samples into m micro-batches as even as possible, the
// larger ones first.
func MicroSizes(n, m int) ([]int, error) {
	if m < 1 || n < m {
		return nil, fmt.Errorf("pipeline: cannot cut %d samples into %d non-empty micro-batches", n, m)
	}
	sizes := make([]int, m)
	for j := range sizes {
		sizes[j] = n / m
		if j < n%m {
			sizes[j]++
		}
	}
	return sizes, nil
}

// Step runs the stage's part of step on a batch of n samples: the first
// stage reads their inputs from b.X, the last their labels from b.Y (the
// others read neither). Random layers take model.MixSeed(noiseSeed, j) for
// micro-batch j. The stage's gradient, the sum over the micro-batches of
// the gradient of the whole batch's mean loss, is in the model's Grads
// when Step returns; ready (if not nil) is called for each bucket as the
// last backward pass completes it. A failed send or receive, or ctx
// ending, fails the step: the gradients are then not valid.
func (st *Stage) Step(ctx context.Context, step uint64, n int, b model.Batch, noiseSeed uint64, ready func(bucket int)) (res Result, err error) {
	sizes, err := MicroSizes(n, st.cfg.Micro)
	if err != nil {
		return res, err
	}
	pos := st.m.LabelsPerSample()
	if st.first && len(b.X) != n*st.inEl {
		return res, fmt.Errorf("pipeline: first stage: %d input values for %d samples of %d", len(b.X), n, st.inEl)
	}
	if st.last && len(b.Y) != n*pos {
		return res, fmt.Errorf("pipeline: last stage: %d labels for %d samples of %d", len(b.Y), n, pos)
	}
	offs := make([]int, len(sizes)+1)
	for j, s := range sizes {
		offs[j+1] = offs[j] + s
	}
	st.sent, st.recvd = 0, 0
	st.choose()
	st.busy = 0
	for j := range st.held { // a failed step's
		st.release(j)
	}
	defer func() { res.Sent, res.Received = st.sent, st.recvd }()
	scale := 1 / float32(n*pos)
	backwards := 0
	for _, op := range st.ops {
		j := op.Micro
		nj := sizes[j]
		in := model.StageInput{N: nj, Train: true, NoiseSeed: model.MixSeed(noiseSeed, uint64(j))}
		if st.last {
			in.Y = b.Y[offs[j]*pos : offs[j+1]*pos]
		}
		if op.Kind == Forward {
			if st.first {
				in.X = b.X[offs[j]*st.inEl : offs[j+1]*st.inEl]
			} else {
				if in.X, err = st.recv(ctx, Key{step, j, Activation}, st.ins, st.buffer(j, nj*st.inEl)); err != nil {
					return res, err
				}
			}
			s, err := st.forward(in)
			if err != nil {
				return res, fmt.Errorf("pipeline: stage %d step %d micro-batch %d forward: %w", st.cfg.Stage, step, j, err)
			}
			if st.last {
				res.Stats.Add(s)
				continue
			}
			if err := st.send(ctx, Key{step, j, Activation}, st.outs[st.outPick], st.tag(st.outPick), st.y, Pos(step, j, Activation)); err != nil {
				return res, err
			}
			continue
		}
		if op.Recompute {
			in.X = st.input(b, offs, j)
			if _, err := st.forward(in); err != nil {
				return res, fmt.Errorf("pipeline: stage %d step %d micro-batch %d recomputing: %w", st.cfg.Stage, step, j, err)
			}
			res.Recomputed++
		}
		var dy []float32
		if !st.last {
			st.dy = grow(st.dy, nj*st.outEl)
			if dy, err = st.recv(ctx, Key{step, j, Gradient}, st.outs, st.dy); err != nil {
				return res, err
			}
		}
		var dx []float32
		if !st.first {
			st.dx = grow(st.dx, nj*st.inEl)
			dx = st.dx
		}
		backwards++
		cb := ready
		if backwards < st.cfg.Micro {
			cb = nil
		}
		t0 := time.Now()
		err = st.m.StageBackward(dy, scale, dx, backwards > 1, cb)
		st.busy += time.Since(t0)
		if err != nil {
			return res, fmt.Errorf("pipeline: stage %d step %d micro-batch %d backward: %w", st.cfg.Stage, step, j, err)
		}
		st.release(j)
		if !st.first {
			if err := st.send(ctx, Key{step, j, Gradient}, st.ins[st.inPick], st.tag(st.inPick), dx, Pos(step, j, Gradient)); err != nil {
				return res, err
			}
		}
	}
	st.compute = st.busy / time.Duration(st.cfg.Micro)
	return res, nil
}

// Pos is the compress.Pos of micro-batch j's message of kind k in step:
// the stream that stochastic codecs draw from.
func Pos(step uint64, j int, k Kind) compress.Pos {
	return compress.Pos{Step: step, Stream: uint32(j)<<2 | uint32(k)}
}

// forward runs in through the model, writing the output (stages but the
// last) into st.y.
func (st *Stage) forward(in model.StageInput) (model.Stats, error) {
	var out []float32
	if !st.last {
		st.y = grow(st.y, in.N*st.outEl)
		out = st.y
	}
	t0 := time.Now()
	defer func() { st.busy += time.Since(t0) }()
	return st.m.StageForward(in, out)
}

// input returns micro-batch j's input for a recomputation.
func (st *Stage) input(b model.Batch, offs []int, j int) []float32 {
	if st.first {
		return b.X[offs[j]*st.inEl : offs[j+1]*st.inEl]
	}
	return st.held[j]
}

// buffer returns a buffer of n values to hold micro-batch j's input.
func (st *Stage) buffer(j, n int) []float32 {
	var b []float32
	if k := len(st.spare); k > 0 {
		b, st.spare = st.spare[k-1], st.spare[:k-1]
	}
	st.held[j] = grow(b, n)
	return st.held[j]
}

// release returns micro-batch j's input buffer to the spares.
func (st *Stage) release(j int) {
	if st.held[j] != nil {
		st.spare = append(st.spare, st.held[j])
		st.held[j] = nil
	}
}

// send encodes v with c and sends it as message k, after the codec byte
// tag when it is not -1.
func (st *Stage) send(ctx context.Context, k Key, c compress.Codec, tag int, v []float32, pos compress.Pos) error {
	var err error
	st.enc = st.enc[:0]
	if tag >= 0 {
		st.enc = append(st.enc, byte(tag))
	}
	if st.enc, err = c.Encode(st.enc, v, pos); err != nil {
		return fmt.Errorf("pipeline: stage %d encoding %v: %w", st.cfg.Stage, k, err)
	}
	if err := st.t.Send(ctx, k, st.enc); err != nil {
		return fmt.Errorf("pipeline: stage %d sending %v: %w", st.cfg.Stage, k, err)
	}
	st.sent += int64(len(st.enc))
	return nil
}

// recv receives message k and decodes it into dst with the codec of cs
// its first byte names, or with cs[0] when cs holds one codec.
func (st *Stage) recv(ctx context.Context, k Key, cs []compress.Codec, dst []float32) ([]float32, error) {
	p, err := st.t.Recv(ctx, k)
	if err != nil {
		return nil, fmt.Errorf("pipeline: stage %d receiving %v: %w", st.cfg.Stage, k, err)
	}
	st.recvd += int64(len(p))
	c := cs[0]
	if len(cs) > 1 {
		if len(p) == 0 || int(p[0]) >= len(cs) {
			return nil, fmt.Errorf("pipeline: stage %d: %v names no codec of its link's %d (%s): %w", st.cfg.Stage, k, len(cs), specsOf(cs), ErrBadCodec)
		}
		c, p = cs[p[0]], p[1:]
	}
	if err := c.Decode(dst, p); err != nil {
		return nil, fmt.Errorf("pipeline: stage %d decoding %v: %w", st.cfg.Stage, k, err)
	}
	return dst, nil
}

// ErrBadCodec: a message whose codec byte names none of its link's codecs.
var ErrBadCodec = errors.New("pipeline: unknown activation codec")

// specsOf lists the codecs' specs.
func specsOf(cs []compress.Codec) string {
	specs := make([]string, len(cs))
	for i, c := range cs {
		specs[i] = c.Spec()
	}
	return strings.Join(specs, ", ")
}

// ErrNoTie: SumTied on a stage that holds no side of a shared weight.
var ErrNoTie = errors.New("pipeline: the stage shares no weight with another stage")

// SumTied adds the other end's part of the shared weight's gradient (the
// gpt's token table, held by the first and the last stage) to this
// stage's, exchanging them as fp32 Tied messages of step. Both ends then
// hold the same sum bit for bit (a+b = b+a in IEEE arithmetic), so their
// copies stay identical under any optimizer. With replicas, call it after
// each stage's all-reduce of its own gradients: every replica of a stage
// then adds the same two averages (docs/pipeline.md). It returns ErrNoTie
// on a stage without a side (a middle stage, or a pipeline of one stage).
func (st *Stage) SumTied(ctx context.Context, step uint64) error {
	off, n, ok := st.m.TiedRange()
	if !ok {
		return ErrNoTie
	}
	g := st.m.Grads()[off : off+n]
	k := Key{Step: step, Kind: Tied}
	st.enc = appendFloats(st.enc[:0], g)
	if err := st.t.Send(ctx, k, st.enc); err != nil {
		return fmt.Errorf("pipeline: stage %d sending %v: %w", st.cfg.Stage, k, err)
	}
	p, err := st.t.Recv(ctx, k)
	if err != nil {
		return fmt.Errorf("pipeline: stage %d receiving %v: %w", st.cfg.Stage, k, err)
	}
	if len(p) != 4*n {
		return fmt.Errorf("pipeline: stage %d: %v of %d bytes, want %d", st.cfg.Stage, k, len(p), 4*n)
	}
	st.tiedSum = grow(st.tiedSum, n)
	model.BytesToFloats(st.tiedSum, p)
	for i, v := range st.tiedSum {
		g[i] += v
	}
	return nil
}

// Agree decides with the other stages whether the pipeline applies step,
// after every stage's all-reduce (and SumTied): ok says whether this
// stage's gradient can be applied (finite), and the verdict is true only
// when every stage's is, so that no stage applies a step another refuses.
// A Commit message carries the verdict so far forward from stage 0 to
// S−1; the last stage adds its own and sends it back with loss, its loss
// over the step's batch, in Loss messages. Every stage returns the
// verdict and the last stage's loss. 2(S−1) small messages in sequence:
// the end of each step is a barrier across the pipeline.
func (st *Stage) Agree(ctx context.Context, step uint64, ok bool, loss float64) (float64, bool, error) {
	var b [LossBytes]byte
	if !st.first {
		k := Key{Step: step, Kind: Commit}
		p, err := st.t.Recv(ctx, k)
		if err != nil {
			return 0, false, fmt.Errorf("pipeline: stage %d receiving %v: %w", st.cfg.Stage, k, err)
		}
		if len(p) != CommitBytes || p[0] > 1 {
			return 0, false, fmt.Errorf("pipeline: stage %d: a %v of %d bytes (%v)", st.cfg.Stage, k, len(p), p)
		}
		ok = ok && p[0] == 1
	}
	if !st.last {
		k := Key{Step: step, Kind: Commit}
		if ok {
			b[0] = 1
		}
		if err := st.t.Send(ctx, k, b[:CommitBytes]); err != nil {
			return 0, false, fmt.Errorf("pipeline: stage %d sending %v: %w", st.cfg.Stage, k, err)
		}
		k.Kind = Loss
		p, err := st.t.Recv(ctx, k)
		if err != nil {
			return 0, false, fmt.Errorf("pipeline: stage %d receiving %v: %w", st.cfg.Stage, k, err)
		}
		if len(p) != LossBytes || p[8] > 1 {
			return 0, false, fmt.Errorf("pipeline: stage %d: a %v of %d bytes", st.cfg.Stage, k, len(p))
		}
		loss, ok = math.Float64frombits(binary.LittleEndian.Uint64(p)), p[8] == 1
	}
	if !st.first {
		k := Key{Step: step, Kind: Loss}
		binary.LittleEndian.PutUint64(b[:], math.Float64bits(loss))
		b[8] = 0
		if ok {
			b[8] = 1
		}
		if err := st.t.Send(ctx, k, b[:]); err != nil {
			return 0, false, fmt.Errorf("pipeline: stage %d sending %v: %w", st.cfg.Stage, k, err)
		}
	}
	return loss, ok, nil
}

// appendFloats appends v as little-endian fp32 bytes (model.FloatBytes's
// layout, without allocating).
func appendFloats(dst []byte, v []float32) []byte {
	for _, x := range v {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
	}
	return dst
}

// grow returns b resliced to n values, reallocated when too small.
func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
