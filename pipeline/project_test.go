package pipeline

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/model"
)

var none = CodecCost{Spec: "none", Ratio: 1}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(math.Abs(a), math.Abs(b), 1e-12) }

// equalLayers returns n layers of f and b seconds per sample, params
// parameters and out values per sample each.
func equalLayers(n int, f, b float64, params, out int) []LayerCost {
	ls := make([]LayerCost, n)
	for i := range ls {
		ls[i] = LayerCost{Forward: f, Backward: b, Params: params, Tied: -1, OutElems: out}
	}
	return ls
}

// TestProjectDataParallel checks pure data parallelism against the
// formula by hand: compute B/P·Σ(f+b), ring 2(P−1)/P·4G·ratio/bw + 2(P−1)·RTT.
func TestProjectDataParallel(t *testing.T) {
	s := Setup{Layers: equalLayers(2, 1e-3, 2e-3, 500_000, 10), Peers: 4, Batch: 32, Micro: 4, Bandwidth: 12.5e6, RTT: 1e-3}
	l, err := s.Project(1, none, none)
	if err != nil {
		t.Fatal(err)
	}
	// 8 samples × 6 ms; 1.5 × 4 MB / 12.5 MB/s + 6 ms
	if !near(l.Compute, 0.048) || !near(l.AllReduce, 0.486) || !near(l.Step, 0.534) || !near(l.PeerBytes, 6e6) || l.PeerParams != 1e6 {
		t.Errorf("%+v", l)
	}
	if l.Name() != "dp×4" || l.Act != "" || l.Micro != 1 {
		t.Errorf("name %s, act %q, micro %d", l.Name(), l.Act, l.Micro)
	}
	dyn8, err := CodecCostOf("dyn8")
	if err != nil {
		t.Fatal(err)
	}
	l8, _ := s.Project(1, dyn8, none)
	if !near(l8.AllReduce, 1.5*4e6*dyn8.Ratio/12.5e6+0.006) {
		t.Errorf("dyn8 all-reduce %v", l8.AllReduce)
	}
	topk, _ := CodecCostOf("topk")
	lk, _ := s.Project(1, topk, none)
	if !topk.AllGather || !near(lk.AllReduce, 3*4e6*topk.Ratio/12.5e6+0.003) {
		t.Errorf("topk %+v: all-gather %v", topk, lk.AllReduce)
	}
	one := s
	one.Peers = 1
	if l, _ := one.Project(1, dyn8, none); l.AllReduce != 0 || l.PeerBytes != 0 || !near(l.Step, 32*6e-3) || l.Grad != "" {
		t.Errorf("one peer: %+v", l)
	}
}

// TestProjectBubble checks that S equal stages on free links take
// (M+S−1) slots of a micro-batch's work (with every forward pass run twice
// under GPipe) less the S−1 recomputations that overlap the last stage's
// work, the bubble that leaves, and that replicas split the batch.
func TestProjectBubble(t *testing.T) {
	for _, S := range []int{2, 4} {
		for _, M := range []int{4, 8} {
			s := Setup{Layers: equalLayers(8, 1e-3, 2e-3, 1000, 64), Peers: 2 * S, Batch: 64, Micro: M,
				Bandwidth: 1e18, Schedule: GPipe}
			l, err := s.Project(S, none, none)
			if err != nil {
				t.Fatal(err)
			}
			mb := 64.0 / float64(2*M)     // R = 2 pipelines
			f := mb * float64(8/S) * 1e-3 // a stage's forward pass
			slot := mb * float64(8/S) * (2e-3 + 2e-3)
			want := float64(M+S-1)*slot - float64(S-1)*f
			if bubble := 1 - float64(M)*slot/want; !near(l.Compute, want) || !near(l.Bubble, bubble) {
				t.Errorf("S=%d M=%d: pipeline %v (want %v), bubble %v (want %v)", S, M, l.Compute, want, l.Bubble, bubble)
			}
			if l.Replicas != 2 || l.Split.Stages() != S || l.Name() != fmt.Sprintf("%d×2", S) {
				t.Errorf("layout %+v", l)
			}
		}
	}
}

// TestProjectHopsAndTie checks a gpt-like model in 2 stages: the
// activation bytes per hop, the tied table's copy and exchange, and each
// peer's bytes.
func TestProjectHopsAndTie(t *testing.T) {
	// embedding (owns the table), 2 blocks, a head tied to layer 0
	ls := []LayerCost{
		{Forward: 1e-4, Backward: 1e-4, Params: 5000, Tied: -1, OutElems: 100},
		{Forward: 1e-3, Backward: 2e-3, Params: 20000, Tied: -1, OutElems: 100},
		{Forward: 1e-3, Backward: 2e-3, Params: 20000, Tied: -1, OutElems: 100},
		{Forward: 1e-3, Backward: 2e-3, Params: 0, Tied: 0, TiedParams: 4000, OutElems: 300},
	}
	s := Setup{Layers: ls, Peers: 4, Batch: 16, Micro: 4, Bandwidth: 1e6, RTT: 0.01}
	l, err := s.Project(2, none, none)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.Split, Split{0, 2, 4}) {
		t.Fatalf("split %v", l.Split)
	}
	mbBytes := 2.0 * 100 * 4 // 2 samples per micro-batch (16 / (2 replicas × 4)), 100 values each
	if !near(l.Hop, mbBytes/1e6+0.005) {
		t.Errorf("hop %v, want %v", l.Hop, mbBytes/1e6+0.005)
	}
	if !near(l.Tied, 16000/1e6+0.005) {
		t.Errorf("tied %v", l.Tied)
	}
	if l.PeerParams != 25000 { // stage 0: 25 000; stage 1: 20 000 + a 4 000 copy
		t.Errorf("peer params %d", l.PeerParams)
	}
	ring0 := 2.0 * 1 / 2 * 4 * 25000 // R = 2
	if !near(l.PeerBytes, 4*mbBytes+ring0+16000) {
		t.Errorf("peer bytes %v, want %v", l.PeerBytes, 4*mbBytes+ring0+16000)
	}
	if !near(l.AllReduce, ring0/1e6+0.02) || !near(l.Step, l.Compute+l.AllReduce+l.Tied) {
		t.Errorf("%+v", l)
	}
	dyn8, _ := CodecCostOf("dyn8")
	l8, _ := s.Project(2, none, dyn8)
	if !near(l8.Hop, mbBytes*dyn8.Ratio/1e6+0.005) || l8.Compute >= l.Compute {
		t.Errorf("dyn8 activations: hop %v, pipeline %v (none: %v)", l8.Hop, l8.Compute, l.Compute)
	}
}

// TestPlanPicksTheFastest checks that the plan lists every feasible layout
// once per codec choice, fastest first, and picks data parallelism for a
// small model on fast links and a pipeline for a large model with small
// activations on slow links.
func TestPlanPicksTheFastest(t *testing.T) {
	dyn8, _ := CodecCostOf("dyn8")
	grads, acts := []CodecCost{none, dyn8}, []CodecCost{none, dyn8}
	small := Setup{Layers: equalLayers(8, 1e-3, 2e-3, 10_000, 4096), Peers: 8, Batch: 64, Micro: 4, Bandwidth: 125e6, RTT: 1e-4}
	ls, err := small.Plan(grads, acts)
	if err != nil {
		t.Fatal(err)
	}
	// S = 1 (2 gradient codecs), 2 and 4 (4 codec pairs each), 8 (no ring:
	// 2 activation codecs); 8 peers.
	if len(ls) != 2+2*4+2 {
		t.Fatalf("%d layouts", len(ls))
	}
	for i := 1; i < len(ls); i++ {
		if ls[i].Step < ls[i-1].Step {
			t.Fatalf("not sorted at %d", i)
		}
	}
	if ls[0].Stages != 1 {
		t.Errorf("small model on fast links: picked %s (%s/%s)", ls[0].Name(), ls[0].Grad, ls[0].Act)
	}
	large := Setup{Layers: equalLayers(8, 1e-3, 2e-3, 10_000_000, 256), Peers: 8, Batch: 64, Micro: 8, Bandwidth: 2.5e6, RTT: 1e-3}
	ll, err := large.Plan(grads, acts)
	if err != nil {
		t.Fatal(err)
	}
	if ll[0].Stages != 8 || ll[0].Grad != "" || ll[0].Act != dyn8.Spec {
		t.Errorf("large model on slow links: picked %s (%s/%s), step %v", ll[0].Name(), ll[0].Grad, ll[0].Act, ll[0].Step)
	}
	// 32 micro-batches per pipeline: 2×4 would need 4 × 32 samples, more
	// than the batch; 4×2 and 8×1 fit. 8×1 has no ring: one row per
	// activation codec.
	tight := large
	tight.Micro = 32
	lt, err := tight.Plan(grads, acts)
	if err != nil {
		t.Fatal(err)
	}
	count := map[int]int{}
	for _, l := range lt {
		count[l.Stages]++
	}
	if count[1] != 2 || count[2] != 0 || count[4] != 4 || count[8] != 2 {
		t.Errorf("layouts per stage count %v", count)
	}
}

// TestProjectErrors checks infeasible layouts and bad setups.
func TestProjectErrors(t *testing.T) {
	s := Setup{Layers: equalLayers(4, 1, 1, 1, 1), Peers: 6, Batch: 12, Micro: 4, Bandwidth: 1}
	for _, S := range []int{0, 4, 5, 6} {
		if _, err := s.Project(S, none, none); err == nil {
			t.Errorf("%d stages: no error", S)
		}
	}
	if _, err := s.Project(2, none, none); err != nil {
		t.Errorf("3 replicas × 4 micro-batches of 12 samples: %v", err)
	}
	s.Batch = 11
	if _, err := s.Project(2, none, none); err == nil || !strings.Contains(err.Error(), "at least 12") {
		t.Errorf("3 replicas × 4 micro-batches of 11 samples: %v", err)
	}
	for i, bad := range []Setup{
		{Peers: 1, Batch: 1, Micro: 1, Bandwidth: 1},
		{Layers: s.Layers, Peers: 0, Batch: 1, Micro: 1, Bandwidth: 1},
		{Layers: s.Layers, Peers: 1, Batch: 1, Micro: 1, Bandwidth: 0},
		{Layers: s.Layers, Peers: 1, Batch: 1, Micro: 1, Bandwidth: 1, RTT: -1},
		{Layers: []LayerCost{{Forward: -1, OutElems: 1}}, Peers: 1, Batch: 1, Micro: 1, Bandwidth: 1},
	} {
		if _, err := bad.Project(1, none, none); err == nil {
			t.Errorf("setup %d: no error", i)
		}
	}
	if _, err := s.Plan(nil, []CodecCost{none}); err == nil {
		t.Error("no gradient codecs: no error")
	}
	if _, err := CodecCostOf("powersgd"); err == nil {
		t.Error("powersgd: no error")
	}
	if _, err := CodecCostOf("nope"); err == nil {
		t.Error("unknown codec: no error")
	}
	if _, err := Costs(make([]model.LayerInfo, 2), make([]model.LayerTime, 1), 4); err == nil {
		t.Error("mismatched layer times: no error")
	}
}

// TestCosts checks the conversion of measured times to per-sample costs.
func TestCosts(t *testing.T) {
	infos := []model.LayerInfo{{Params: 3, Tied: -1, OutElems: 5}, {Tied: 0, TiedParams: 7, OutElems: 2}}
	times := []model.LayerTime{{Forward: 4 * time.Millisecond, Backward: 8 * time.Millisecond}, {Forward: time.Millisecond}}
	cs, err := Costs(infos, times, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []LayerCost{{Forward: 1e-3, Backward: 2e-3, Params: 3, Tied: -1, OutElems: 5}, {Forward: 2.5e-4, Tied: 0, TiedParams: 7, OutElems: 2}}
	if !slices.Equal(cs, want) {
		t.Errorf("Costs = %+v, want %+v", cs, want)
	}
	for _, spec := range []struct {
		spec  string
		ratio float64
	}{{"none", 1}, {"fp16", 0.5}, {"dyn8", 0.25 + 1.0/2048}} {
		c, err := CodecCostOf(spec.spec)
		if err != nil || !near(c.Ratio, spec.ratio) || c.AllGather {
			t.Errorf("CodecCostOf(%s) = %+v, %v; want ratio %v", spec.spec, c, err, spec.ratio)
		}
	}
}

// TestProjectPricesProcessorTime works the processor terms out by hand
// for pure data parallelism: the ring's frames (allreduce.RingFrames:
// 2 peers, 2 segments of 500 000 values in 8 chunks each, so 16 frames a
// peer), its bytes and its coded values add to the wire time, and the
// optimizer's step to the step; the zero CPUCost prices none of it.
func TestProjectPricesProcessorTime(t *testing.T) {
	s := Setup{Layers: equalLayers(2, 1e-3, 2e-3, 500_000, 10), Peers: 2, Batch: 16, Micro: 4, Bandwidth: 12.5e6, RTT: 1e-3}
	free, err := s.Project(1, none, none)
	if err != nil {
		t.Fatal(err)
	}
	s.CPU = CPUCost{Update: 2e-9, Message: 10e-6, Byte: 1e-9}
	coded := none
	coded.Code = 3e-9
	l, err := s.Project(1, coded, none)
	if err != nil {
		t.Fatal(err)
	}
	// 16 frames × 10 µs + 4 MB × 1 ns + 1 M values × 3 ns; 1 M parameters × 2 ns.
	cpu := 16*10e-6 + 4e6*1e-9 + 1e6*3e-9
	if !near(l.CommCPU, cpu) || !near(l.AllReduce, free.AllReduce+cpu) || !near(l.Update, 2e-3) ||
		!near(l.Step, free.Step+cpu+2e-3) || !near(l.Compute, free.Compute) || !near(l.PeerBytes, free.PeerBytes) {
		t.Errorf("with processor costs %+v, free %+v", l, free)
	}
	if free.CommCPU != 0 || free.Update != 0 {
		t.Errorf("the zero CPUCost priced %v of communication and %v of update", free.CommCPU, free.Update)
	}
	coded.Code = -1
	if _, err := s.Project(1, coded, none); err == nil || !strings.Contains(err.Error(), "coding time") {
		t.Errorf("a negative coding time: %v", err)
	}
	s.CPU.Byte = math.NaN()
	if _, err := s.Project(1, none, none); err == nil || !strings.Contains(err.Error(), "processor costs") {
		t.Errorf("a NaN byte cost: %v", err)
	}
}

// TestSimulateChargesMessagesToTheirStages works one micro-batch through
// two stages by hand: each pass pays its hop's per-end message time, the
// forward passes for the activation, the backward passes for its
// gradient (4 ends in all), while a recomputation pays none; with the
// device beside the processor the same seconds delay the hops instead.
func TestSimulateChargesMessagesToTheirStages(t *testing.T) {
	const f0, f1, b0, b1, tr, lat, m = 1.0, 2.0, 3.0, 4.0, 0.5, 0.25, 0.125
	tm := Timing{Forward: []float64{f0, f1}, Backward: []float64{b0, b1}, Transfer: []float64{tr}, Latency: lat, Message: []float64{m}}
	got, err := OneFOneB.Simulate(tm, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := f0 + f1 + b0 + b1 + 2*(tr+lat) + 4*m; !near(got, want) {
		t.Errorf("one micro-batch: %v, want %v", got, want)
	}
	// GPipe, 2 micro-batches: every backward pass recomputes its forward
	// pass first (the latest forward pass was another micro-batch's), and
	// a recomputation pays no message. Stage 0: F0 [0, 1.125], F1 [1.125,
	// 2.25]; the activations reach stage 1 at 1.875 and 3. Stage 1: F0
	// [1.875, 4], F1 [4, 6.125], B0 recomputes (2) and runs [8.125, 12.25],
	// B1 recomputes and runs [14.25, 18.375]; the gradients reach stage 0
	// at 13 and 19.125. Stage 0: B0 recomputes [2.25, 3.25] and runs
	// [13, 16.125], B1 recomputes [16.125, 17.125] and runs [19.125, 22.25].
	if got, err = GPipe.Simulate(tm, 2); err != nil {
		t.Fatal(err)
	}
	if want := 22.25; !near(got, want) {
		t.Errorf("GPipe, 2 micro-batches: %v, want %v", got, want)
	}
	beside := tm
	beside.Message, beside.Transfer = nil, []float64{tr + 2*m}
	got, err = OneFOneB.Simulate(beside, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := f0 + f1 + b0 + b1 + 2*(tr+2*m+lat); !near(got, want) {
		t.Errorf("beside the processor: %v, want %v", got, want)
	}
	if _, err := OneFOneB.Simulate(Timing{Forward: []float64{1, 1}, Backward: []float64{1, 1}, Transfer: []float64{1}, Message: []float64{1, 1}}, 1); err == nil {
		t.Error("message times for 2 hops of a 2-stage pipeline were accepted")
	}
}

// TestProjectPricesPipelineMessages: a 2-stage pipeline's messages cost
// each end half a message's processor time in its passes (the simulation
// with Timing.Message), or, beside a GPU, delay their hop by the whole of
// it; CommCPU is a stage's M activations or gradients each way, and the
// update the larger stage's parameters.
func TestProjectPricesPipelineMessages(t *testing.T) {
	s := Setup{Layers: equalLayers(4, 1e-3, 2e-3, 1000, 64), Peers: 2, Batch: 16, Micro: 4, Bandwidth: 1e9,
		CPU: CPUCost{Update: 1e-6, Message: 1e-4, Byte: 1e-9}}
	act := none
	act.Code = 2e-9
	// 4 samples a micro-batch × 64 values: 1024 bytes of fp32.
	msg := 1e-4 + 1024*1e-9 + 256*2e-9
	tm := Timing{Forward: []float64{8e-3, 8e-3}, Backward: []float64{16e-3, 16e-3}, Transfer: []float64{1024 / 1e9}, Message: []float64{msg / 2}}
	want, err := OneFOneB.Simulate(tm, 4)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Project(2, none, act)
	if err != nil {
		t.Fatal(err)
	}
	if !near(l.Compute, want) || !near(l.CommCPU, 4*msg) || !near(l.Update, 2000*1e-6) || !near(l.Step, want+2000*1e-6) {
		t.Errorf("%+v; want compute %v, communication's processor time %v", l, want, 4*msg)
	}
	s.CPU.Beside = true
	tm.Message, tm.Transfer = nil, []float64{1024/1e9 + msg}
	if want, err = OneFOneB.Simulate(tm, 4); err != nil {
		t.Fatal(err)
	}
	if l, err = s.Project(2, none, act); err != nil {
		t.Fatal(err)
	}
	if !near(l.Compute, want) || !near(l.Hop, 1024/1e9+msg) || !near(l.CommCPU, 4*msg) {
		t.Errorf("beside a GPU: %+v; want compute %v, hop %v", l, want, 1024/1e9+msg)
	}
}

// TestProjectLinkCodecs checks the projection of per-link activation
// codecs: each direction of a hop carries the codec its sending stage
// picks by the rule Stage.Step follows, so links far faster than the
// compute project none's step, links far slower dyn8's, and a heavy first
// stage beside a light second one sends its activations exactly while
// the light stage compresses their gradients.
func TestProjectLinkCodecs(t *testing.T) {
	dyn8, err := CodecCostOf("dyn8")
	if err != nil {
		t.Fatal(err)
	}
	auto, err := WithLadder(dyn8, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := specsOfCosts(auto.Ladder); !slices.Equal(got, []string{"none", "bf16", dyn8.Spec}) {
		t.Fatalf("ladder %v", got)
	}
	ls := equalLayers(4, 1e-3, 2e-3, 1000, 1000) // 4 micro-batches of 1 sample: 4 kB each in fp32
	for _, tc := range []struct {
		bw    float64
		links string
		same  CodecCost
	}{{1e9, "none/none", none}, {1e5, dyn8.Spec + "/" + dyn8.Spec, dyn8}} {
		s := Setup{Layers: ls, Peers: 2, Batch: 4, Micro: 4, Bandwidth: tc.bw, RTT: 1e-4}
		got, err := s.Project(2, none, auto)
		if err != nil {
			t.Fatal(err)
		}
		want, err := s.Project(2, none, tc.same)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.ActLinks, []string{tc.links}) || got.Step != want.Step || got.PeerBytes != want.PeerBytes {
			t.Errorf("links of %g B/s: hops %v, step %v and %v bytes; want %s, %s's %v and %v", tc.bw, got.ActLinks, got.Step, got.PeerBytes,
				tc.links, tc.same.Spec, want.Step, want.PeerBytes)
		}
		if got.Act != "none|bf16|"+dyn8.Spec {
			t.Errorf("act %q", got.Act)
		}
	}
	// Stage 0 computes 6 ms a micro-batch (1F1B recomputes its forward
	// passes), stage 1 0.3 ms: at 20 MB/s none's 3 kB more than dyn8 take
	// 150 µs, within 0.8 of 5 % of stage 0's compute (240 µs), and bf16's
	// 1 kB more 50 µs, above stage 1's 12 µs.
	heavy := []LayerCost{{Forward: 2e-3, Backward: 2e-3, Params: 10, Tied: -1, OutElems: 1000}, {Forward: 1e-4, Backward: 2e-4, Params: 10, Tied: -1, OutElems: 10}}
	s := Setup{Layers: heavy, Peers: 2, Batch: 4, Micro: 4, Bandwidth: 20e6, RTT: 1e-4}
	got, err := s.Project(2, none, auto)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.ActLinks, []string{"none/" + dyn8.Spec}) {
		t.Fatalf("hops %v, want none forward and dyn8 back", got.ActLinks)
	}
	lo, _ := s.Project(2, none, dyn8)
	hi, _ := s.Project(2, none, none)
	// The busiest sender is stage 0, with none's activations.
	if !(got.Step >= lo.Step && got.Step <= hi.Step) || got.PeerBytes != hi.PeerBytes {
		t.Errorf("mixed hop: step %v, %v bytes; want a step between dyn8's %v and none's %v, and none's %v bytes", got.Step, got.PeerBytes, lo.Step, hi.Step, hi.PeerBytes)
	}
}

// TestSimulateTransferBack checks that the gradients' own transfer times
// are the ones their direction takes.
func TestSimulateTransferBack(t *testing.T) {
	tm := Timing{Forward: []float64{1, 1}, Backward: []float64{1, 1}, Transfer: []float64{0.5}}
	base, err := GPipe.Simulate(tm, 2)
	if err != nil {
		t.Fatal(err)
	}
	tm.TransferBack = []float64{0.5}
	if same, _ := GPipe.Simulate(tm, 2); same != base {
		t.Errorf("equal gradient transfers: %v, want %v", same, base)
	}
	tm.TransferBack = []float64{3}
	// GPipe, 2 stages, 2 micro-batches: stage 1's last backward pass ends
	// at 5.5; its gradients reach stage 0 3 s after each other's link time.
	if slow, _ := GPipe.Simulate(tm, 2); !(slow > base+2) {
		t.Errorf("slow gradient transfers: %v, want above %v", slow, base+2)
	}
	tm.TransferBack = []float64{1, 2}
	if _, err := GPipe.Simulate(tm, 2); err == nil {
		t.Error("a TransferBack of 2 hops for 1 accepted")
	}
}

// TestProjectIdleMembers: with Setup.Idle a layout of S stages that does
// not divide the peers leaves the last Peers mod S idle and projects as
// the peers that train; with PerPeerBatch its batch shrinks with them, and
// Plan ranks the layouts by time per sample, so a layout with an idle
// member wins over data parallelism of every member on slow links.
func TestProjectIdleMembers(t *testing.T) {
	dyn8, _ := CodecCostOf("dyn8")
	five := Setup{Layers: equalLayers(4, 1e-3, 2e-3, 1_000_000, 256), Peers: 5, Batch: 40, Micro: 4, Bandwidth: 2.5e6, RTT: 1e-3}
	if _, err := five.Project(2, dyn8, dyn8); err == nil {
		t.Fatal("2 stages on 5 peers without Idle: no error")
	}
	five.Idle = true
	got, err := five.Project(2, dyn8, dyn8)
	if err != nil {
		t.Fatal(err)
	}
	four := five
	four.Peers, four.Idle = 4, false
	want, err := four.Project(2, dyn8, dyn8)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name() != "2×2+1" || got.Idle != 1 || got.Batch != 40 || got.Step != want.Step || got.PeerBytes != want.PeerBytes {
		t.Errorf("2 stages of 5 peers: %s, idle %d, batch %d, step %v; want 2×2+1 and 4 peers' step %v with the batch of 40", got.Name(), got.Idle, got.Batch, got.Step, want.Step)
	}
	five.PerPeerBatch = 8 // 8 samples per member that trains
	got, err = five.Project(2, dyn8, dyn8)
	if err != nil {
		t.Fatal(err)
	}
	four.Batch = 32
	if want, _ = four.Project(2, dyn8, dyn8); got.Batch != 32 || got.Step != want.Step {
		t.Errorf("8 samples per member: 2×2+1 takes %d samples in %v s; want 32 in %v", got.Batch, got.Step, want.Step)
	}
	ls, err := five.Plan([]CodecCost{dyn8}, []CodecCost{dyn8})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for i, l := range ls {
		names = append(names, l.Name())
		if i > 0 && l.Step/float64(l.Batch) < ls[i-1].Step/float64(ls[i-1].Batch) {
			t.Errorf("not sorted by time per sample at %d", i)
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(names)), []string{"2×2+1", "3×1+2", "4×1+1", "dp×5"}) {
		t.Errorf("layouts %v; want dp×5, 2×2+1, 3×1+2 and 4×1+1", names)
	}
	if ls[0].Idle == 0 {
		t.Errorf("a 4 M-parameter model on 20 Mbit/s links: %s ranks first; want a layout with idle members over dp×5", ls[0].Name())
	}
}

// TestProjectLayoutLinks: with Setup.LayoutLinks a pipeline layout's hops
// run at the rate it gives them and its stages' rings at theirs, while
// pure data parallelism keeps Bandwidth.
func TestProjectLayoutLinks(t *testing.T) {
	dyn8, _ := CodecCostOf("dyn8")
	slow, fast := 2.5e6, 125e6 // 20 Mbit/s and 1 Gbit/s
	s := Setup{Layers: equalLayers(4, 1e-3, 2e-3, 1_000_000, 4096), Peers: 4, Batch: 32, Micro: 4, Bandwidth: slow, RTT: 1e-3}
	uniform, err := s.Project(2, dyn8, dyn8)
	if err != nil {
		t.Fatal(err)
	}
	dpBefore, _ := s.Project(1, dyn8, dyn8)
	s.LayoutLinks = func(stages int) ([]float64, float64) { return []float64{fast}, slow }
	racks, err := s.Project(2, dyn8, dyn8)
	if err != nil {
		t.Fatal(err)
	}
	values := 32.0 / (2 * 4) * 4096 // a micro-batch's activations
	if want := values*4*dyn8.Ratio/fast + 5e-4; !near(racks.Hop, want) || racks.HopRate != fast || racks.RingRate != slow {
		t.Errorf("hops at 1 Gbit/s: hop %v s (want %v), rates %v and %v", racks.Hop, want, racks.HopRate, racks.RingRate)
	}
	if racks.AllReduce != uniform.AllReduce || !(racks.Step < uniform.Step) {
		t.Errorf("rings at 20 Mbit/s both ways: all-reduce %v and %v, steps %v (fast hops) and %v", racks.AllReduce, uniform.AllReduce, racks.Step, uniform.Step)
	}
	if dp, _ := s.Project(1, dyn8, dyn8); dp.Step != dpBefore.Step {
		t.Errorf("data parallelism moved from %v to %v s with the layout's links", dpBefore.Step, dp.Step)
	}
}

// TestProjectSlowdown: with Setup.Slowdown each layout computes at the
// speed of the slowest member it trains with. Five members, one 3× slower
// than the others: data parallelism trains with it and computes 3× longer,
// 2×2+1 leaves it idle and computes as measured, so on free links the
// idle layout ranks first per sample where it would not without.
func TestProjectSlowdown(t *testing.T) {
	s := Setup{Layers: equalLayers(4, 1e-3, 2e-3, 1000, 16), Peers: 5, Batch: 40, Micro: 4, Bandwidth: 1e12, RTT: 1e-6,
		Idle: true, PerPeerBatch: 8}
	plain, err := s.Project(1, none, none)
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.Plan([]CodecCost{none}, []CodecCost{none})
	if err != nil {
		t.Fatal(err)
	}
	s.Slowdown = func(stages int) float64 {
		if stages == 1 {
			return 3 // the slow member trains
		}
		return 1 // it sits idle
	}
	slowDP, err := s.Project(1, none, none)
	if err != nil {
		t.Fatal(err)
	}
	if !near(slowDP.Compute, 3*plain.Compute) {
		t.Errorf("data parallelism with a 3× slower member: compute %v, want 3 × %v", slowDP.Compute, plain.Compute)
	}
	after, err := s.Plan([]CodecCost{none}, []CodecCost{none})
	if err != nil {
		t.Fatal(err)
	}
	if before[0].Stages != 1 || after[0].Idle == 0 {
		t.Errorf("fastest without Slowdown %s (want dp×5), with it %s (want a layout that idles the slow member)", before[0].Name(), after[0].Name())
	}
	s.Slowdown = func(int) float64 { return math.NaN() }
	if l, _ := s.Project(1, none, none); l.Compute != plain.Compute {
		t.Errorf("a NaN slowdown changed the compute from %v to %v", plain.Compute, l.Compute)
	}
}

// TestProjectHopRates: LayoutLinks gives each hop its own rate. Three
// stages whose first hop is fast and second slow project a step between
// the layouts with both hops fast and both slow, and the slowest hop's
// transfer as Hop.
func TestProjectHopRates(t *testing.T) {
	dyn8, _ := CodecCostOf("dyn8")
	slow, fast := 2.5e6, 125e6
	s := Setup{Layers: equalLayers(6, 1e-3, 2e-3, 100_000, 4096), Peers: 3, Batch: 24, Micro: 4, Bandwidth: 1e9, RTT: 1e-3}
	project := func(hops ...float64) Layout {
		t.Helper()
		s.LayoutLinks = func(int) ([]float64, float64) { return hops, 0 }
		l, err := s.Project(3, dyn8, dyn8)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	both, mixed, none := project(fast, fast), project(fast, slow), project(slow, slow)
	if !slices.Equal(mixed.HopRates, []float64{fast, slow}) || mixed.HopRate != slow || mixed.Hop != none.Hop {
		t.Errorf("fast then slow hop: rates %v (slowest %v), hop %v s; want [%v %v], %v and the slow hop's %v s",
			mixed.HopRates, mixed.HopRate, mixed.Hop, fast, slow, slow, none.Hop)
	}
	if !(both.Step < mixed.Step && mixed.Step < none.Step) {
		t.Errorf("steps: both hops fast %v, fast then slow %v, both slow %v; want them increasing", both.Step, mixed.Step, none.Step)
	}
	if l := project(fast); !slices.Equal(l.HopRates, []float64{1e9, 1e9}) {
		t.Errorf("a list of one rate for two hops: rates %v, want Bandwidth's for both", l.HopRates)
	}
}
