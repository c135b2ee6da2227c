package pipeline

import (
	"fmt"

	"github.com/p2ptrain/p2ptrain/compress"
)

// DefaultCodec is the activations' default codec: Dettmers' 8-bit dynamic
// tree, a quarter of fp32's bytes.
const DefaultCodec = "dyn8"

// ValidateCodec checks that spec names a codec activations can take: one
// that encodes each tensor on its own (class linear or quantized: none,
// fp16, bf16, int8, dyn8, qsgd). Codecs that keep error feedback across
// steps, share scales around a ring, sparsify or factor gradients do not
// apply to a tensor sent once.
func ValidateCodec(spec string) error {
	_, err := newCodec(spec, 1, 0)
	return err
}

// newCodec builds spec's codec for tensors of up to n values.
func newCodec(spec string, n int, seed uint64) (compress.Codec, error) {
	c, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(n), Seed: seed})
	if err != nil {
		return nil, fmt.Errorf("pipeline: activation codec: %w", err)
	}
	if cl := c.Class(); cl != compress.ClassLinear && cl != compress.ClassQuantized {
		return nil, fmt.Errorf("pipeline: activation codec %s is of class %v: activations take a linear or quantized codec (none, fp16, bf16, int8, dyn8, qsgd)", c.Spec(), cl)
	}
	return c, nil
}

// MaxPayload bounds the encoded size of a message of n activation values
// (or their gradients) under codec spec: what a receiver must accept.
func MaxPayload(spec string, n int) (int, error) {
	c, err := newCodec(spec, max(n, 1), 0)
	if err != nil {
		return 0, err
	}
	return c.MaxEncodedLen(n), nil
}

// Ladder returns the codecs a stage may carry on one link under
// train.activation_link_codecs = "auto", from the most exact to spec (a
// spec ValidateCodec accepts, in canonical form): none, then bf16 when spec
// takes fewer than its 2 bytes a value, then spec. With spec none it is
// just none. Stage.Step sends each message with the most exact of them
// whose extra transfer the stage's compute affords (pickCodec).
func Ladder(spec string) ([]string, error) {
	c, err := newCodec(spec, ladderProbe, 0)
	if err != nil {
		return nil, err
	}
	out := []string{"none"}
	if c.Spec() == out[0] {
		return out, nil
	}
	bf, err := newCodec("bf16", ladderProbe, 0)
	if err != nil {
		return nil, err
	}
	if c.MaxEncodedLen(ladderProbe) < bf.MaxEncodedLen(ladderProbe) {
		out = append(out, bf.Spec())
	}
	return append(out, c.Spec()), nil
}

// ladderProbe is the tensor size Ladder compares codecs' sizes at.
const ladderProbe = 1 << 16

// LadderPayload bounds the payload of a message of n values under the
// codecs of ladder: the largest encoding, and, with several codecs, the
// byte that names the one used.
func LadderPayload(ladder []string, n int) (int, error) {
	most := 0
	for _, spec := range ladder {
		p, err := MaxPayload(spec, n)
		if err != nil {
			return 0, err
		}
		most = max(most, p)
	}
	if len(ladder) > 1 {
		most++
	}
	return most, nil
}

// WithLadder returns activation codec c projected under
// train.activation_link_codecs = "auto": with Ladder(c.Spec)'s codecs in
// c.Ladder, each with its coding seconds per value from code (by
// canonical spec; c's own Code kept). A ladder of one codec (none) leaves
// c as it is.
func WithLadder(c CodecCost, code map[string]float64) (CodecCost, error) {
	specs, err := Ladder(c.Spec)
	if err != nil {
		return CodecCost{}, err
	}
	if len(specs) < 2 {
		return c, nil
	}
	c.Ladder = make([]CodecCost, len(specs))
	for i, spec := range specs[:len(specs)-1] {
		if c.Ladder[i], err = CodecCostOf(spec); err != nil {
			return CodecCost{}, err
		}
		c.Ladder[i].Code = code[c.Ladder[i].Spec]
	}
	last := c
	last.Ladder = nil
	c.Ladder[len(specs)-1] = last
	return c, nil
}
