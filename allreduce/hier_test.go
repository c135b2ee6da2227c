package allreduce_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"testing/synctest"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/memtransport"
	"github.com/p2ptrain/p2ptrain/compress"
)

func TestParseHierarchicalSchedule(t *testing.T) {
	good := map[string]allreduce.Schedule{
		"hier":           "hier",
		"hier-16x16":     "hier-16x16",
		"hier-4-4-3":     "hier-4x2-3",
		"hier-3x1-3-2x2": "hier-3x2-2x2",
		"hier-1":         "hier-1",
	}
	for in, want := range good {
		got, err := allreduce.ParseSchedule(in)
		if err != nil || got != want || !got.Hierarchical() {
			t.Errorf("ParseSchedule(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"hier-", "hier-0", "hier-3x0", "hier-x3", "hier-3-", "hier--3", "hier-+3", "hier-3x", "hier-3y2",
		"hier-1x999999999", "hier-65536x2", "hierx", "hier-a"} {
		if s, err := allreduce.ParseSchedule(in); !errors.Is(err, allreduce.ErrConfig) {
			t.Errorf("ParseSchedule(%q) = %q, %v; want ErrConfig", in, s, err)
		}
	}
	for _, s := range []allreduce.Schedule{allreduce.ScheduleRing, allreduce.ScheduleAuto, "hierarchical"} {
		if s.Hierarchical() {
			t.Errorf("%q is not hierarchical", s)
		}
	}
	if _, err := allreduce.Schedule("hier-4x2").Groups(9); !errors.Is(err, allreduce.ErrConfig) {
		t.Errorf("groups of 8 peers for a ring of 9: %v", err)
	}
	if g, err := allreduce.Schedule("hier-4x2-1").Groups(9); err != nil || !slices.Equal(g, []int{4, 4, 1}) {
		t.Errorf("hier-4x2-1: %v, %v", g, err)
	}
}

func TestDefaultGroups(t *testing.T) {
	want := map[int]string{1: "hier-1", 2: "hier-1x2", 6: "hier-2x3", 8: "hier-3x2-2", 16: "hier-4x4", 64: "hier-8x8", 256: "hier-16x16"}
	for w := 1; w <= 300; w++ {
		g := allreduce.DefaultGroups(w)
		sum := 0
		for _, x := range g {
			sum += x
			if x < g[len(g)-1] || x > g[0] || g[0]-g[len(g)-1] > 1 {
				t.Fatalf("W=%d: unbalanced groups %v", w, g)
			}
		}
		if sum != w {
			t.Fatalf("W=%d: groups %v hold %d peers", w, g, sum)
		}
		if s := allreduce.HierarchicalSchedule(g); want[w] != "" && string(s) != want[w] {
			t.Errorf("W=%d: %s, want %s", w, s, want[w])
		}
		if back, err := allreduce.HierarchicalSchedule(g).Groups(w); err != nil || !slices.Equal(back, g) {
			t.Fatalf("W=%d: %v does not survive its name: %v, %v", w, g, back, err)
		}
	}
}

// runHier runs one step of one bucket per peer under cfg and returns the
// outputs, failing the test on any error.
func runHier(t *testing.T, cfg allreduce.Config, data [][]float32, codec func(n int) compress.Codec) [][]float32 {
	t.Helper()
	w := len(data)
	c := newCluster(t, w, 1, cfg, memOpts())
	defer c.close()
	in := make([][][]float32, w)
	codecs := make([][]compress.Codec, w)
	for i := range in {
		in[i] = [][]float32{data[i]}
		codecs[i] = []compress.Codec{codec(len(data[i]))}
	}
	outs, errs := c.round(4, in, codecs)
	out := make([][]float32, w)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s, W=%d: peer %d: %v", cfg.Schedule, w, i, err)
		}
		out[i] = outs[i][0]
	}
	return out
}

// TestHierarchicalMatchesRing: with groups of uneven sizes at W = 6, 8 and
// 16, every peer ends with the same bits, and these equal the flat ring's
// average up to fp32 summation order. Both sum each element's W values in
// fp32 along a chain (the ring) or a two-level tree (the hierarchy) and
// round once more dividing by W, so by the classic bound for recursive
// summation (each of d additions along a path adds at most u = 2⁻²⁴ of the
// partial sum) they differ by at most
//
//	((W−1) + (gmax−1) + (G−1)) · u · Σ|xᵢ| / W + u · (|ring| + |hier|)
//
// for G groups of at most gmax peers.
func TestHierarchicalMatchesRing(t *testing.T) {
	const u = 1.0 / (1 << 24)
	cases := []struct {
		w      int
		groups []int
	}{
		{6, []int{3, 2, 1}}, {6, []int{2, 2, 2}}, {6, []int{1, 5}},
		{8, []int{3, 3, 2}}, {8, []int{1, 4, 3}}, {8, []int{8}},
		{16, []int{5, 6, 5}}, {16, []int{4, 4, 4, 4}}, {16, []int{7, 1, 8}}, {16, allreduce.DefaultGroups(16)},
		{17, []int{16, 1}}, // the lone peer owns 16 columns: more than one a lane
	}
	codecs := []struct {
		spec string
		make func(n int) compress.Codec
	}{
		{"fake-fp32", func(int) compress.Codec { return fakeFP32{} }},
		{"none", func(n int) compress.Codec { return mustCodec(t, "none", n) }},
	}
	for _, k := range cases {
		sch := allreduce.HierarchicalSchedule(k.groups)
		t.Run(fmt.Sprintf("W=%d/%s", k.w, sch), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				for c, cd := range codecs {
					sizes := []int{0, 1, k.w - 1, 37, 1001}
					if c > 0 {
						sizes = []int{1001}
					}
					for _, n := range sizes {
						data := randData(uint64(7*k.w+n), k.w, n)
						ring := runHier(t, allreduce.Config{ChunkBytes: 64, Schedule: allreduce.ScheduleRing}, data, cd.make)
						hier := runHier(t, allreduce.Config{ChunkBytes: 64, Schedule: sch}, data, cd.make)
						for i := 1; i < k.w; i++ {
							if !bitsEqual(hier[0], hier[i]) {
								t.Fatalf("%s n=%d: peer %d's average differs from peer 0's", cd.spec, n, i)
							}
						}
						G, gmax := len(k.groups), slices.Max(k.groups)
						depth := float64(k.w-1) + float64(gmax-1) + float64(G-1)
						for j := 0; j < n; j++ {
							abs := 0.0
							for i := range data {
								abs += math.Abs(float64(data[i][j]))
							}
							a, b := float64(ring[0][j]), float64(hier[0][j])
							bound := depth*u*abs/float64(k.w) + u*(math.Abs(a)+math.Abs(b))
							if d := math.Abs(a - b); !(d <= bound) {
								t.Fatalf("%s n=%d: element %d: ring %v, hierarchical %v, |Δ| %g > %g", cd.spec, n, j, a, b, d, bound)
							}
						}
					}
				}
			})
		})
	}
}

func mustCodec(t *testing.T, spec string, n int) compress.Codec {
	t.Helper()
	cd, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(n), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return cd
}

// TestHierarchicalLossyLinear: fp16 and bf16 re-encode partial sums at every
// hop of both levels; the peers still agree bit for bit and stay within
// the codec's error of the average.
func TestHierarchicalLossyLinear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for spec, tol := range map[string]float64{"fp16": 2e-3, "bf16": 2e-2} {
			data := randData(3, 8, 5003)
			out := runHier(t, allreduce.Config{ChunkBytes: 512, Schedule: "hier-3x2-2"}, data,
				func(n int) compress.Codec { return mustCodec(t, spec, n) })
			for i := 1; i < len(out); i++ {
				if !bitsEqual(out[0], out[i]) {
					t.Fatalf("%s: peer %d differs from peer 0", spec, i)
				}
			}
			if e := relRMS(out[0], average(data)); e > tol {
				t.Errorf("%s: relative RMS error %g > %g", spec, e, tol)
			}
		}
	})
}

// TestHierarchicalOtherClasses: the hierarchical schedule carries linear
// codecs; the others run their class default and still agree.
func TestHierarchicalOtherClasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 6, 1, allreduce.Config{Schedule: "hier-2x3"}, memOpts())
		s := c.sessions[0]
		for class, want := range map[compress.Class]allreduce.Schedule{
			compress.ClassLinear:        "hier-2x3",
			compress.ClassQuantized:     allreduce.ScheduleDirect,
			compress.ClassSharedScale:   allreduce.ScheduleRing,
			compress.ClassErrorFeedback: allreduce.ScheduleDirect,
			compress.ClassSparse:        allreduce.ScheduleAllGather,
			compress.ClassLowRank:       allreduce.ScheduleRing,
		} {
			if got := s.ScheduleFor(class); got != want {
				t.Errorf("class %v: schedule %q, want %q", class, got, want)
			}
		}
		c.close()
		q := func(_ []float32, d [][]float32) float64 { return float64(len(d)+1) * absMax(d) * float64(len(d)) / 127 }
		cfg := allreduce.Config{Schedule: "hier-2x3"}
		checkRound(t, codecCase{"q8-hier", func(int) compress.Codec { return fakeQ8{} }, q, cfg}, 6, 1001, 64)
		checkRound(t, codecCase{"s8-hier", func(int) compress.Codec { return fakeS8{bucket: 8} }, q, cfg}, 6, 1001, 64)
		checkRound(t, codecCase{"lowrank-hier", func(n int) compress.Codec { return &fakeLowRank{n: n} },
			func([]float32, [][]float32) float64 { return 1e-5 }, cfg}, 6, 1001, 64)
	})
}

func TestHierarchicalGroupsMustCoverTheRing(t *testing.T) {
	net := memtransport.New(memtransport.Options{})
	ps := peerIDs(5)
	_, err := allreduce.NewSession(allreduce.Ring{Number: 1, Peers: ps, Self: ps[0]}, net.Endpoint(ps[0]), allreduce.Config{Schedule: "hier-2x2"})
	if !errors.Is(err, allreduce.ErrConfig) {
		t.Fatalf("groups of 4 peers in a ring of 5: %v, want ErrConfig", err)
	}
}

// TestHierarchicalPeerDies: a peer killed in the middle of a hierarchical
// round fails the round on every peer, and every survivor names it.
func TestHierarchicalPeerDies(t *testing.T) {
	for _, victim := range []allreduce.PeerID{"peer-0", "peer-4", "peer-7"} {
		t.Run(string(victim), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pes := failRound(t, 8, allreduce.Config{Schedule: "hier-3x2-2"}, memOpts(), func(c *cluster) {
					c.net.SetHook(func(from, to allreduce.PeerID, frame []byte) error {
						if from == victim && c.net.Sent(from) == 5 {
							c.net.Kill(from)
							return memtransport.ErrDead
						}
						return nil
					})
				}, allreduce.ErrPeerFailed)
				for i, pe := range pes {
					if c := fmt.Sprintf("peer-%d", i); c != string(victim) && pe.Peer != victim {
						t.Errorf("%s blames %s, want %s: %v", c, pe.Peer, victim, pe)
					}
				}
			})
		})
	}
}

// TestHierarchicalBadFrameNamesSender: a frame of the cross-group level
// with another codec id fails the round everywhere, naming its sender.
func TestHierarchicalBadFrameNamesSender(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pes := failRound(t, 6, allreduce.Config{Schedule: "hier-3-2-1"}, memOpts(), func(c *cluster) {
			c.net.SetHook(func(from, to allreduce.PeerID, frame []byte) error {
				// Cross-group frames carry sub-rounds 2 and up.
				if ph := allreduce.Phase(frame[1]); from == "peer-1" && ph.Kind() == allreduce.PhaseReduce && ph.Sub() >= 2 {
					frame[4] ^= 0xff
				}
				return nil
			})
		}, allreduce.ErrCodecMismatch)
		for i, pe := range pes {
			if pe.Peer != "peer-1" {
				t.Errorf("peer %d blames %s, want peer-1: %v", i, pe.Peer, pe)
			}
		}
	})
}
