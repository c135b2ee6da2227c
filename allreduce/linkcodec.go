package allreduce

import (
	"fmt"

	"github.com/p2ptrain/p2ptrain/compress"
)

// CanonicalLinkCodec checks that spec names a codec the ring schedule can carry
// per link (ClassLinear or ClassQuantized) and returns its canonical form.
func CanonicalLinkCodec(spec string) (string, error) {
	c, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(1)})
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cl := c.Class(); cl != compress.ClassLinear && cl != compress.ClassQuantized {
		return "", fmt.Errorf("%w: codec %s is %v; per-link codecs need a linear or quantized codec (none, fp16, bf16, int8, dyn8, qsgd)",
			ErrConfig, c.Spec(), cl)
	}
	return c.Spec(), nil
}

// NewLinkCodecs returns the LinkCodecs of the peer at ring position rank
// for the edge specs and all-gather spec that EdgeCodecs returns, each codec
// made by mk. Every codec must be linear or quantized.
func NewLinkCodecs(edges []string, final string, rank int, mk func(spec string) (compress.Codec, error)) (*LinkCodecs, error) {
	w := len(edges)
	if rank < 0 || rank >= w {
		return nil, fmt.Errorf("%w: rank %d outside %d link codecs", ErrConfig, rank, w)
	}
	lk := &LinkCodecs{}
	for _, c := range []struct {
		dst  *compress.Codec
		spec string
	}{{&lk.Send, edges[rank]}, {&lk.Recv, edges[(rank+w-1)%w]}, {&lk.Final, final}} {
		cd, err := mk(c.spec)
		if err != nil {
			return nil, fmt.Errorf("%w: link codec %q: %w", ErrConfig, c.spec, err)
		}
		if cl := cd.Class(); cl != compress.ClassLinear && cl != compress.ClassQuantized {
			return nil, fmt.Errorf("%w: link codec %s is %v, not linear or quantized", ErrConfig, cd.Spec(), cl)
		}
		*c.dst = cd
	}
	return lk, nil
}
