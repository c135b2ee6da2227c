package allreduce_test

import (
	"testing"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
)

// BenchmarkRoundWorldOne is one step's all-reduce of the mlp's 269,322
// gradients (784-256-256-10) in a ring of one, per codec: what a lone peer,
// or the PyTorch bridge with one peer, pays per step for nothing to
// exchange.
func BenchmarkRoundWorldOne(b *testing.B) {
	const n = 269_322
	for _, spec := range []string{"none", "sint8"} {
		b.Run(spec, func(b *testing.B) {
			c := newCluster(b, 1, 1, allreduce.Config{}, memOpts())
			defer c.close()
			cd, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(n), Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			data := randData(1, 1, n)
			codecs := [][]compress.Codec{{cd}}
			b.SetBytes(4 * n)
			b.ResetTimer()
			for i := range b.N {
				if _, errs := c.round(uint64(i), [][][]float32{{data[0]}}, codecs); errs[0] != nil {
					b.Fatal(errs[0])
				}
			}
		})
	}
}
