package compress

import (
	"runtime"
	"testing"
)

// loop runs f b.N times and reports "cpuGB/s": bytes per second of the
// benchmark thread's CPU time, which other load on the machine does not skew.
func loop(b *testing.B, bytes int, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.SetBytes(int64(bytes))
	start, n := threadCPU(), 0
	for b.Loop() {
		f()
		n++
	}
	if cpu := threadCPU() - start; cpu > 0 {
		b.ReportMetric(float64(bytes)*float64(n)/cpu.Seconds()/1e9, "cpuGB/s")
	}
}

// benchSpecs are the codecs the benchmarks measure (targets in issue 3).
var benchSpecs = []string{
	"none", "fp16", "bf16", "int8", "sint8", "dyn8", "qsgd:bits=4", "qsgd:bits=8", "qsgd:bits=2",
	"onebit", "sign", "topk:ratio=0.01", "topk:ratio=0.01,dgc=true", "powersgd:rank=4", "acpsgd:rank=4",
}

// benchLayout: 4 Mi float32, one 1024×4096 matrix for the low-rank codecs
// (1024×1024 is benchmarked separately).
func benchLayout(spec string) Layout {
	c, _ := New(spec, Options{})
	if c != nil && c.Class() == ClassLowRank {
		return Layout{Shapes: [][]int{{1024, 4096}}}
	}
	return FlatLayout(4 << 20)
}

func benchCodec(b *testing.B, spec string, layout Layout) (Codec, []float32, []byte) {
	c := mustNew(b, spec, Options{Layout: layout, Seed: 1, SharedSeed: 2})
	g := gradient(1, layout.Len())
	p, err := c.Encode(nil, g, Pos{Feedback: true})
	if err != nil {
		b.Fatal(err)
	}
	return c, g, p
}

func BenchmarkEncode(b *testing.B) {
	run := func(b *testing.B, spec string, layout Layout) {
		c, g, p := benchCodec(b, spec, layout)
		b.ReportMetric(float64(4*len(g))/float64(len(p)), "ratio")
		var err error
		step := uint64(0)
		loop(b, 4*len(g), func() {
			step++
			if p, err = c.Encode(p[:0], g, Pos{Step: step, Feedback: true}); err != nil {
				b.Fatal(err)
			}
		})
	}
	for _, spec := range benchSpecs {
		b.Run(spec, func(b *testing.B) { run(b, spec, benchLayout(spec)) })
	}
	for _, spec := range []string{"powersgd:rank=4", "acpsgd:rank=4"} {
		b.Run(spec+"/1024x1024", func(b *testing.B) { run(b, spec, Layout{Shapes: [][]int{{1024, 1024}}}) })
	}
}

func benchDecode(b *testing.B, add bool) {
	run := func(b *testing.B, spec string, layout Layout) {
		c, g, p := benchCodec(b, spec, layout)
		out := make([]float32, len(g))
		loop(b, 4*len(g), func() {
			var err error
			if add {
				err = c.DecodeAdd(out, p)
			} else {
				err = c.Decode(out, p)
			}
			if err != nil {
				b.Fatal(err)
			}
		})
	}
	for _, spec := range benchSpecs {
		b.Run(spec, func(b *testing.B) { run(b, spec, benchLayout(spec)) })
	}
	for _, spec := range []string{"powersgd:rank=4", "acpsgd:rank=4"} {
		b.Run(spec+"/1024x1024", func(b *testing.B) { run(b, spec, Layout{Shapes: [][]int{{1024, 1024}}}) })
	}
}

func BenchmarkDecode(b *testing.B) { benchDecode(b, false) }

func BenchmarkDecodeAdd(b *testing.B) { benchDecode(b, true) }
