package sgemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// BenchmarkPack measures packing a 120×256 block of A and a 256×256 block of
// B, as stored and transposed; SetBytes counts the elements packed.
func BenchmarkPack(b *testing.B) {
	const mc, nc, kc = 120, 256, 256
	src, _, _ := benchOperands(256, 1, 256)
	dst := make([]float32, 256*256)
	for _, trans := range []bool{false, true} {
		b.Run(fmt.Sprintf("A/trans=%v", trans), func(b *testing.B) {
			b.SetBytes(4 * mc * kc)
			for b.Loop() {
				packA(trans, src, 256, 0, 0, mc, kc, dst)
			}
		})
		b.Run(fmt.Sprintf("B/trans=%v", trans), func(b *testing.B) {
			b.SetBytes(4 * kc * nc)
			for b.Loop() {
				packB(trans, src, 256, 0, 0, kc, nc, dst)
			}
		})
	}
}

// TestPack checks that the assembly packing, where there is one, writes the
// same panels as the Go packing, and nothing past them.
func TestPack(t *testing.T) {
	if asmKernel == nil {
		t.Skip("no assembly packing in this build")
	}
	rnd := rand.New(rand.NewPCG(13, 14))
	src := make([]float32, 80*90)
	for i := range src {
		src[i] = float32(rnd.NormFloat64())
	}
	pack := func(useAsm bool, f func(dst []float32), size int) []float32 {
		old := asmPack
		asmPack = useAsm
		defer func() { asmPack = old }()
		dst := make([]float32, size+guard)
		for i := range dst {
			dst[i] = guardValue
		}
		f(dst[:size])
		return dst
	}
	for _, trans := range []bool{false, true} {
		for _, mc := range []int{1, 5, 6, 7, 12, 17, 30} {
			for _, kc := range []int{1, 7, 8, 9, 16, 23, 40} {
				for _, off := range []int{0, 3} {
					packAt := func(dst []float32) { packA(trans, src, 90, off, off+1, mc, kc, dst) }
					size := (mc + mr - 1) / mr * mr * kc
					if g, w := pack(true, packAt, size), pack(false, packAt, size); !slices.EqualFunc(g, w, sameBits) {
						t.Fatalf("packA trans=%v mc=%d kc=%d off=%d: asm and Go packing differ", trans, mc, kc, off)
					}
					nc := 2*mc + 3
					packBt := func(dst []float32) { packB(trans, src, 90, off, off+1, kc, nc, dst) }
					size = (nc + nr - 1) / nr * nr * kc
					if g, w := pack(true, packBt, size), pack(false, packBt, size); !slices.EqualFunc(g, w, sameBits) {
						t.Fatalf("packB trans=%v nc=%d kc=%d off=%d: asm and Go packing differ", trans, nc, kc, off)
					}
				}
			}
		}
	}
}

func sameBits(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) }
