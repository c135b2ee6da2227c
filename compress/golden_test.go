package compress

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"os"
	"testing"
)

// goldenInput returns n seeded values with zeros, negative zeros, tiny,
// subnormal and large values mixed in, and (when poison) a NaN and an Inf.
func goldenInput(seed uint64, n int, poison bool) []float32 {
	g := gradient(seed, n)
	for i := range g {
		switch (uint64(i)*golden + seed) % 97 {
		case 0:
			g[i] = 0
		case 1:
			g[i] = float32(math.Copysign(0, -1))
		case 2:
			g[i] *= 1e-30
		case 3:
			g[i] = math.Float32frombits(uint32(i) & 0x807fffff) // subnormal
		case 4:
			g[i] *= 1e6
		}
	}
	if poison && n > 3000 {
		g[n/3] = float32(math.NaN())
		g[2*n/3] = float32(math.Inf(-1))
	}
	return g
}

// goldenDigest hashes the payloads, decodes and residual-driven later payloads
// of spec over several layouts, regions and steps.
func goldenDigest(t *testing.T, spec string) string {
	h := sha256.New()
	var f32 [4]byte
	hashF := func(v []float32) {
		for _, x := range v {
			binary.LittleEndian.PutUint32(f32[:], math.Float32bits(x))
			h.Write(f32[:])
		}
	}
	c0, _ := New(spec, Options{})
	layouts := []Layout{FlatLayout(10007), FlatLayout(1 << 16), {Shapes: [][]int{{96, 80}, {33}, {40, 3, 3}, {5, 7}}}}
	if c0.Class() == ClassLowRank {
		layouts = append(layouts, Layout{Shapes: [][]int{{64, 128}}}, Layout{Shapes: [][]int{{129, 67}}})
	}
	for li, layout := range layouts {
		n := layout.Len()
		c := mustNew(t, spec, Options{Layout: layout, Seed: 11, SharedSeed: 12})
		var payload []byte
		for step := range 4 {
			g := goldenInput(uint64(li*10+step), n, step == 2)
			regions := [][2]int{{0, n}}
			if c.Class() != ClassLowRank {
				regions = append(regions, [2]int{0, 4099 % n}, [2]int{4099 % n, n})
			}
			for ri, r := range regions {
				pos := Pos{Offset: r[0], Step: uint64(step), Stream: uint32(ri), Feedback: step != 3 || ri != 0}
				var err error
				payload, err = c.Encode(payload[:0], g[r[0]:r[1]], pos)
				if err != nil {
					t.Fatal(err)
				}
				h.Write(payload)
				dec := make([]float32, r[1]-r[0])
				if err := c.Decode(dec, payload); err != nil {
					t.Fatal(err)
				}
				hashF(dec)
				if err := c.DecodeAdd(dec, payload); err != nil {
					t.Fatal(err)
				}
				hashF(dec)
			}
			if s, ok := c.(SharedScaler); ok {
				scales := make([]float32, s.NumScales(n))
				s.Scales(scales, g)
				hashF(scales)
				for _, peers := range []int{1, 2, 3} {
					p, err := s.EncodeScaled(nil, g, scales, peers, Pos{Step: uint64(step)})
					if err != nil {
						t.Fatal(err)
					}
					h.Write(p)
					dec := make([]float32, n)
					if err := s.DecodeScaled(dec, p, scales, peers); err != nil {
						t.Fatal(err)
					}
					hashF(dec)
				}
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// goldenDigests pin the exact output of every codec: any change to a kernel
// must keep the bytes (GOLDEN_PRINT=1 prints the current digests).
var goldenDigests = map[string]string{
	"none":                          "16280c767a4d89d9",
	"fp16":                          "7ef399ca122b27ad",
	"bf16":                          "1cd499e98541ff55",
	"int8:block=2048":               "acd3a749315214ae",
	"sint8:block=2048":              "312d569a29fa0739",
	"dyn8:block=2048":               "7bd3e3af348d828b",
	"qsgd:bits=4,block=512,norm=l2": "4a910bd585533491",
	"onebit:block=2048":             "6cb0b8de937210ba",
	"sign:block=2048":               "816ff30a81ebbce9",
	"topk:ratio=0.01,dgc=false":     "9bddf1b34efe3584",
	"powersgd:rank=4":               "2d3e017ee3f05945",
	"acpsgd:rank=4":                 "d42441175c071ebb",
	"qsgd:bits=2":                   "55c2400d3b9a91ce",
	"qsgd:bits=8,norm=linf":         "348980403a93b74d",
	"topk:ratio=0.01,dgc=true":      "3e081c945a357731",
	"powersgd:rank=1":               "ef39ddca9511b963",
	"acpsgd:rank=3":                 "83dedc55b4afdfd3",
	"sign:block=13":                 "87a05718e7ffb51a",
	"onebit:block=13":               "eccd3e2f77333916",
	"sint8:block=9":                 "e7df5b7e318918a2",
}

func TestGoldenOutput(t *testing.T) {
	for _, spec := range append(Specs(), "qsgd:bits=2", "qsgd:bits=8,norm=linf", "topk:ratio=0.01,dgc=true",
		"powersgd:rank=1", "acpsgd:rank=3", "sign:block=13", "onebit:block=13", "sint8:block=9") {
		got := goldenDigest(t, spec)
		if os.Getenv("GOLDEN_PRINT") != "" {
			t.Logf("%q: %q,", spec, got)
			continue
		}
		if want, ok := goldenDigests[spec]; !ok || got != want {
			t.Errorf("%s: output digest %s, want %s", spec, got, want)
		}
	}
}

// TestGoldenOutputTwins runs the golden digests again on the pure-Go twins of
// the assembly kernels (the purego build tag runs only those).
func TestGoldenOutputTwins(t *testing.T) {
	if !useAVX2 {
		t.Skip("the pure-Go kernels already ran")
	}
	useAVX2 = false
	defer func() { useAVX2 = true }()
	TestGoldenOutput(t)
}
