// Package compress holds p2ptrain's gradient codecs behind one interface.
//
// A Codec is created per fusion bucket from a spec string ("qsgd:bits=4,block=512")
// and a Layout (the shapes of the tensors packed, in order, into the bucket's flat
// fp32 buffer). It owns the bucket's error-feedback state. The package knows nothing
// about networks or peers: the allreduce package drives codecs according to their
// Class (docs/codecs.md, "Classes and schedules").
//
// # Spec strings
//
// New, Validate and Canonical accept none, fp16, bf16, int8[:block=2048],
// sint8[:block=2048], dyn8[:block=2048], qsgd[:bits=2|4|8,block=512,norm=l2|linf],
// onebit[:block=2048], sign[:block=2048], topk[:ratio=0.01,dgc=false,momentum=0.9],
// powersgd[:rank=4] and acpsgd[:rank=4]; Spec returns the canonical form with every
// parameter spelled out (momentum only with dgc=true). Specs lists the defaults.
//
// # Payloads
//
// Payloads carry no codec tag or value count: the decoder takes the count from
// len(dst) and checks the payload length, every header field (scales must be
// finite and non-negative, or NaN) and every padding bit and index. Codecs with
// scale blocks (block=N values per scale) count blocks from the start of the
// slice handed to Encode. Encode output is a
// deterministic function of (input, Options.Seed, Options.SharedSeed, Pos, codec
// state): the random streams are counter-based (wyrand of a key mixed from Seed,
// Step, Stream and Offset), every sum has a fixed order and no multiply-add is fused.
//
// # Non-finite input
//
//   - none, fp16, bf16: NaN and ±Inf pass through (fp16 and bf16 round overflow to ±Inf).
//   - int8, sint8, dyn8, qsgd, onebit, sign: a block holding NaN or ±Inf is sent
//     with NaN scales and decodes to all NaN; onebit and sign reset that block's
//     residual so the poison does not outlive the step. sint8's Scales reports NaN
//     (or +Inf) for such a block and DecodeScaled gives NaN for a non-finite scale.
//   - topk: NaN and ±Inf rank above every finite magnitude, so they are sent
//     (and leave the residual) first.
//   - powersgd, acpsgd: a matrix whose local factor is not finite resets its error;
//     one whose all-reduced factor is not finite decodes to NaN and resets its
//     shared state to the seeded initial value (the same on every peer).
//
// # Concurrency
//
// Encode, Reset and the SharedScaler and LowRank methods of one instance must not
// run concurrently. Decode and DecodeAdd only read the instance's configuration,
// so they may run concurrently with anything.
package compress

import "errors"

// Class says how a ring may carry a codec's payloads.
type Class int

const (
	// ClassLinear codecs (none, fp16, bf16) are stateless element-wise encodings:
	// a ring hop decodes, accumulates in fp32 and re-encodes.
	ClassLinear Class = iota
	// ClassSharedScale codecs (sint8) are summable as integers once every peer
	// uses the same per-block scale; they implement SharedScaler.
	ClassSharedScale
	// ClassQuantized codecs (int8, dyn8, qsgd) are not summable: decode → fp32 sum →
	// re-encode at each hop, or the two-phase (direct) schedule.
	ClassQuantized
	// ClassErrorFeedback codecs (onebit, sign) are not summable and keep residuals:
	// two-phase with an owner re-encode, or an all-gather of every peer's bits.
	ClassErrorFeedback
	// ClassSparse codecs (topk) are carried by an all-gather of every peer's payload;
	// receivers DecodeAdd all payloads in rank order.
	ClassSparse
	// ClassLowRank codecs (powersgd, acpsgd) all-reduce fp32 factors; they
	// implement LowRank.
	ClassLowRank
)

// String returns the class name.
func (c Class) String() string {
	switch c {
	case ClassLinear:
		return "linear"
	case ClassSharedScale:
		return "shared-scale"
	case ClassQuantized:
		return "quantized"
	case ClassErrorFeedback:
		return "error-feedback"
	case ClassSparse:
		return "sparse"
	case ClassLowRank:
		return "low-rank"
	}
	return "unknown"
}

// Layout describes the tensors packed, in order, into a bucket's flat buffer.
type Layout struct {
	// Shapes of the tensors, row-major; a tensor of n elements may be given as [n].
	Shapes [][]int
}

// Len returns the number of fp32 values the layout covers.
func (l Layout) Len() int {
	n := 0
	for _, s := range l.Shapes {
		p := 1
		for _, d := range s {
			p *= d
		}
		n += p
	}
	return n
}

// FlatLayout is the layout of a single vector of n values.
func FlatLayout(n int) Layout { return Layout{Shapes: [][]int{{n}}} }

// Options configures a codec instance.
type Options struct {
	// Layout of the bucket this instance encodes. Required.
	Layout Layout
	// Seed for this peer's random streams (QSGD's stochastic rounding, sint8's
	// stochastic rounding). Peers should use different seeds.
	Seed uint64
	// SharedSeed is identical on every peer (PowerSGD / ACP-SGD initial Q).
	SharedSeed uint64
}

// Pos says where a slice handed to Encode lies and when it is encoded.
type Pos struct {
	// Offset of the slice's first element in the bucket's flat buffer.
	Offset int
	// Step is the training step (part of every random stream).
	Step uint64
	// Stream distinguishes several encodes of the same region in one step
	// (e.g. a ring hop number, or an owner's re-encode); part of random streams.
	Stream uint32
	// Feedback applies and updates the error-feedback residual of the region
	// (only for codecs that keep one). The caller sets it when encoding its own
	// local gradient and clears it when re-encoding a partial or final sum.
	Feedback bool
}

// Codec is one gradient codec instance for one bucket.
//
// Encode must not allocate per call in steady state (dst with enough capacity).
// Decode and DecodeAdd validate every length and header field against len(dst)
// and return an error wrapping ErrCorrupt for any malformed payload; they never
// panic and never allocate more than len(dst) implies.
type Codec interface {
	// Spec returns the canonical spec string, with every parameter spelled out.
	Spec() string
	// Class says how a ring carries this codec.
	Class() Class
	// MaxEncodedLen bounds the encoded size of n values.
	MaxEncodedLen(n int) int
	// Encode appends the encoding of src to dst and returns the extended slice.
	Encode(dst []byte, src []float32, pos Pos) ([]byte, error)
	// Decode writes the values encoded in src into dst (len(dst) values).
	Decode(dst []float32, src []byte) error
	// DecodeAdd adds the values encoded in src to dst (len(dst) values).
	DecodeAdd(dst []float32, src []byte) error
	// Reset zeroes all error-feedback residuals (a joining peer starts here).
	Reset()
}

// SharedScaler is implemented by ClassSharedScale codecs (sint8).
//
// Schedule: every peer computes Scales of its slice; the ring MAX-all-reduces
// them; every peer encodes with the agreed scales and the ring size; the ring
// sums payloads with AddEncoded; DecodeScaled turns the integer sum into fp32.
type SharedScaler interface {
	// Block is the number of values that share one scale. Callers align the
	// slices they encode to multiples of Block (relative to Offset 0).
	Block() int
	// NumScales returns how many scales n values need.
	NumScales(n int) int
	// Scales writes the per-block absmax of src into dst[:NumScales(len(src))].
	Scales(dst, src []float32)
	// EncodeScaled appends src quantized with the agreed absmax values, for a ring of peers.
	EncodeScaled(dst []byte, src, absmax []float32, peers int, pos Pos) ([]byte, error)
	// AddEncoded adds payload b into payload a in the integer domain.
	AddEncoded(a, b []byte) error
	// DecodeScaled writes the values of the (summed) payload src into dst.
	DecodeScaled(dst []float32, src []byte, absmax []float32, peers int) error
}

// LowRank is implemented by ClassLowRank codecs (powersgd, acpsgd). Each step
// runs Rounds() fp32 all-reduces (SUM) of the factors it hands out.
type LowRank interface {
	// Rounds returns the number of all-reduces per step (PowerSGD 2, ACP-SGD 1).
	Rounds() int
	// Factor returns the round's local factor for the bucket's gradient grad
	// (round 0 receives the gradient; later rounds may pass nil). The slice is
	// owned by the codec and valid until the next call.
	Factor(round int, step uint64, grad []float32) ([]float32, error)
	// Absorb takes the all-reduced SUM of the round's factor from peers peers.
	// After the last round it writes the averaged gradient into out.
	Absorb(round int, sum []float32, peers int, out []float32) error
	// ResetShared returns the state every peer must share (Q) to its seeded
	// initial value. All peers call it at the same step (an epoch change).
	ResetShared()
}

// ErrCorrupt is wrapped by every decode error caused by a malformed payload.
var ErrCorrupt = errors.New("compress: corrupt payload")

// ErrShape is wrapped by errors from a slice that does not fit the layout.
var ErrShape = errors.New("compress: shape mismatch")
