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
