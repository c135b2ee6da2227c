package compress

import (
	"errors"
	"testing"
)

// fuzzDecode fuzzes a codec's Decode and DecodeAdd with payloads for up to
// maxN values (the whole layout for low-rank codecs): they must never panic and
// must fail only with ErrCorrupt or ErrShape. Valid payloads seed the corpus.
func fuzzDecode(f *testing.F, spec string, layout Layout) {
	c := mustNew(f, spec, Options{Layout: layout, Seed: 1, SharedSeed: 2})
	n := layout.Len()
	lowRank := c.Class() == ClassLowRank
	for i, m := range []int{0, 1, 7, 64, n} {
		if lowRank && m != n {
			continue
		}
		g := gradient(uint64(i), m)
		if m > 3 {
			g[3] = canonicalNaN
		}
		p, err := c.Encode(nil, g, Pos{Feedback: true})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p, uint16(m))
		if len(p) > 0 {
			f.Add(p[:len(p)-1], uint16(m))
		}
	}
	f.Fuzz(func(t *testing.T, p []byte, m uint16) {
		size := int(m) % (n + 1)
		if lowRank {
			size = n
		}
		dst := make([]float32, size)
		for _, err := range []error{c.Decode(dst, p), c.DecodeAdd(dst, p)} {
			if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShape) {
				t.Fatalf("%s: error %v wraps neither ErrCorrupt nor ErrShape", spec, err)
			}
		}
	})
}

var fuzzLayout = Layout{Shapes: [][]int{{24, 16}, {9}, {3, 2}}}

func FuzzDecodeNone(f *testing.F)     { fuzzDecode(f, "none", fuzzLayout) }
func FuzzDecodeFP16(f *testing.F)     { fuzzDecode(f, "fp16", fuzzLayout) }
func FuzzDecodeBF16(f *testing.F)     { fuzzDecode(f, "bf16", fuzzLayout) }
func FuzzDecodeInt8(f *testing.F)     { fuzzDecode(f, "int8:block=50", fuzzLayout) }
func FuzzDecodeSInt8(f *testing.F)    { fuzzDecode(f, "sint8:block=50", fuzzLayout) }
func FuzzDecodeDyn8(f *testing.F)     { fuzzDecode(f, "dyn8:block=50", fuzzLayout) }
func FuzzDecodeQSGD2(f *testing.F)    { fuzzDecode(f, "qsgd:bits=2,block=13", fuzzLayout) }
func FuzzDecodeQSGD4(f *testing.F)    { fuzzDecode(f, "qsgd:bits=4,block=13", fuzzLayout) }
func FuzzDecodeQSGD8(f *testing.F)    { fuzzDecode(f, "qsgd:bits=8,block=13", fuzzLayout) }
func FuzzDecodeOneBit(f *testing.F)   { fuzzDecode(f, "onebit:block=50", fuzzLayout) }
func FuzzDecodeSign(f *testing.F)     { fuzzDecode(f, "sign:block=50", fuzzLayout) }
func FuzzDecodeTopK(f *testing.F)     { fuzzDecode(f, "topk:ratio=0.1", fuzzLayout) }
func FuzzDecodePowerSGD(f *testing.F) { fuzzDecode(f, "powersgd:rank=2", fuzzLayout) }
func FuzzDecodeACPSGD(f *testing.F)   { fuzzDecode(f, "acpsgd:rank=2", fuzzLayout) }

// FuzzSInt8Scaled fuzzes the shared-scale path: AddEncoded and DecodeScaled.
func FuzzSInt8Scaled(f *testing.F) {
	c := mustNew(f, "sint8:block=16", Options{Layout: FlatLayout(64)}).(*sint8Codec)
	f.Add([]byte{1, 2, 3}, []byte{4, 5, 6}, uint8(2), float32(1))
	f.Add([]byte{127}, []byte{1}, uint8(1), float32(0))
	f.Fuzz(func(t *testing.T, a, b []byte, peers uint8, absmax float32) {
		if err := c.AddEncoded(a, b); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatal(err)
		}
		dst := make([]float32, len(a))
		scales := make([]float32, c.NumScales(len(a)))
		for i := range scales {
			scales[i] = absmax
		}
		_ = c.DecodeScaled(dst, a, scales, int(peers))
	})
}
