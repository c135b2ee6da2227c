package allreduce_test

import (
	"fmt"
	"math"
	"testing"
	"testing/synctest"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/plan"
)

// relRMS returns ‖out − avg‖ / ‖avg‖.
func relRMS(out, avg []float32) float64 {
	var e, a float64
	for i := range avg {
		d := float64(out[i] - avg[i])
		e += d * d
		a += float64(avg[i]) * float64(avg[i])
	}
	if a == 0 {
		return math.Sqrt(e)
	}
	return math.Sqrt(e / a)
}

func layoutFor(spec string, n int) compress.Layout {
	if n >= 4000 {
		return compress.Layout{Shapes: [][]int{{40, 100}, {n - 4000}}}
	}
	return compress.FlatLayout(n)
}

// TestAllReduceRealCodecs runs every compress codec through its schedules:
// results are bit-identical on every peer and, for codecs without error
// feedback, within the codec's tolerance of the fp32 average.
func TestAllReduceRealCodecs(t *testing.T) {
	type rc struct {
		spec  string
		sched allreduce.Schedule
		tol   float64 // relative RMS error bound; 0: identity only
	}
	cases := []rc{
		{"none", "", 1e-6}, {"none", allreduce.ScheduleDirect, 1e-6},
		{"fp16", "", 2e-3}, {"bf16", "", 2e-2},
		{"int8", "", 0.05}, {"int8", allreduce.ScheduleRing, 0.1},
		{"sint8", "", 0.2}, {"sint8", allreduce.ScheduleDirect, 0.2},
		{"dyn8", "", 0.1}, {"dyn8", allreduce.ScheduleRing, 0.2},
		{"qsgd:bits=8", "", 0.5}, {"qsgd:bits=4", "", 3}, {"qsgd:bits=2", allreduce.ScheduleRing, 0},
		{"onebit", "", 0}, {"onebit", allreduce.ScheduleAllGather, 0},
		{"sign", "", 0}, {"topk:ratio=0.1", "", 0}, {"topk:ratio=1", "", 1e-6},
		{"powersgd:rank=2", "", 0}, {"acpsgd:rank=2", "", 0},
	}
	for _, k := range cases {
		t.Run(fmt.Sprintf("%s/%s", k.spec, k.sched), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				for _, w := range []int{1, 2, 3, 5, 8} {
					for _, n := range []int{0, 1, w + 1, 5003} {
						runReal(t, k.spec, k.sched, k.tol, w, n)
					}
				}
			})
		})
	}
}

func runReal(t *testing.T, spec string, sched allreduce.Schedule, tol float64, w, n int) {
	t.Helper()
	c := newCluster(t, w, 2, allreduce.Config{ChunkBytes: 4096, Schedule: sched}, memOpts())
	defer c.close()
	d := randData(uint64(w*1000+n), w, n)
	data := make([][][]float32, w)
	codecs := make([][]compress.Codec, w)
	for i := 0; i < w; i++ {
		cd, err := compress.New(spec, compress.Options{Layout: layoutFor(spec, n), Seed: uint64(i + 1), SharedSeed: 42})
		if err != nil {
			t.Fatal(err)
		}
		data[i] = [][]float32{d[i]}
		codecs[i] = []compress.Codec{cd}
	}
	for step := uint64(0); step < 2; step++ {
		outs, errs := c.round(step, data, codecs)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s W=%d n=%d step %d: peer %d: %v", spec, w, n, step, i, err)
			}
		}
		for i := 1; i < w; i++ {
			if !bitsEqual(outs[0][0], outs[i][0]) {
				t.Fatalf("%s W=%d n=%d: peer %d differs", spec, w, n, i)
			}
		}
		if tol > 0 && n > 0 {
			if e := relRMS(outs[0][0], average(d)); !(e <= tol) {
				t.Fatalf("%s W=%d n=%d: relative error %g > %g", spec, w, n, e, tol)
			}
		}
	}
}

// TestPerLinkCodecs: a ring with one slow edge encodes that hop with a
// stronger codec of the family; results stay bit-identical and accurate.
func TestPerLinkCodecs(t *testing.T) {
	for _, tc := range []struct {
		spec string
		tol  float64
	}{{"none", 2e-3}, {"qsgd:bits=8", 3}} {
		synctest.Test(t, func(t *testing.T) {
			w, n := 4, 5003
			m := make(plan.Matrix, w)
			for i := range m {
				m[i] = []float64{100, 100, 100, 100}
			}
			m[1][2] = 50
			order := []int{0, 1, 2, 3}
			specs, final, err := plan.EdgeCodecs(tc.spec, m, order, "")
			if err != nil {
				t.Fatal(err)
			}
			c := newCluster(t, w, 1, allreduce.Config{ChunkBytes: 4096, Schedule: allreduce.ScheduleRing}, memOpts())
			defer c.close()
			d := randData(5, w, n)
			mk := func(spec string, i int) compress.Codec {
				cd, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(n), Seed: uint64(i + 1)})
				if err != nil {
					t.Fatal(err)
				}
				return cd
			}
			outs := make([][]float32, w)
			errs := make([]error, w)
			done := make(chan int)
			for i := 0; i < w; i++ {
				go func() {
					outs[i] = make([]float32, n)
					b := allreduce.Bucket{ID: 0, Codec: mk(final, i), Data: d[i], Out: outs[i],
						Links: &allreduce.LinkCodecs{Send: mk(specs[i], i), Recv: mk(specs[(i+w-1)%w], i), Final: mk(final, i)}}
					errs[i] = c.sessions[i].AllReduce(t.Context(), 0, b)
					done <- i
				}()
			}
			for range w {
				<-done
			}
			for i := 0; i < w; i++ {
				if errs[i] != nil {
					t.Fatalf("%s: peer %d: %v", tc.spec, i, errs[i])
				}
				if !bitsEqual(outs[0], outs[i]) {
					t.Fatalf("%s: peer %d differs", tc.spec, i)
				}
			}
			if e := relRMS(outs[0], average(d)); e > tc.tol {
				t.Fatalf("%s (%v): relative error %g", tc.spec, specs, e)
			}
			t.Logf("%s: edges %v, error %.2g", tc.spec, specs, relRMS(outs[0], average(d)))
		})
	}
}

// TestSharedScaleNaNPropagates: one peer's NaN reaches every peer's sint8
// average as a non-finite value. The MAX all-reduce of the shared scales
// once dropped a NaN operand, turning the NaN into a finite average.
func TestSharedScaleNaNPropagates(t *testing.T) {
	for _, bad := range []int{0, 2} { // a NaN on either side of the MAX
		const w, n = 3, 1000
		c := newCluster(t, w, 1, allreduce.Config{ChunkBytes: 256}, memOpts())
		d := randData(3, w, n)
		d[bad][17] = float32(math.NaN())
		data := make([][][]float32, w)
		codecs := make([][]compress.Codec, w)
		for i := range data {
			cd, err := compress.New("sint8", compress.Options{Layout: compress.FlatLayout(n), Seed: uint64(i + 1)})
			if err != nil {
				t.Fatal(err)
			}
			data[i], codecs[i] = [][]float32{d[i]}, []compress.Codec{cd}
		}
		outs, errs := c.round(0, data, codecs)
		c.close()
		for i := range outs {
			if errs[i] != nil {
				t.Fatalf("peer %d: %v", i, errs[i])
			}
			finite := true
			for _, v := range outs[i][0] {
				finite = finite && !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0)
			}
			if finite {
				t.Fatalf("NaN on peer %d: peer %d's sint8 average is finite", bad, i)
			}
		}
	}
}
