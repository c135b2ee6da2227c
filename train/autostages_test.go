package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/model"
	"github.com/p2ptrain/p2ptrain/node"
	"github.com/p2ptrain/p2ptrain/pipeline"
	"github.com/p2ptrain/p2ptrain/plan"
)

// fakeCosts are per-sample layer costs of cfg's model, as if measured:
// block forward passes cost blockMs, the other layers a tenth of it, and
// every backward pass twice its forward pass. Tests inject them
// (Options.LayerCosts) so that no choice depends on this machine's speed.
func fakeCosts(t *testing.T, cfg config.Train, blockMs float64) []pipeline.LayerCost {
	t.Helper()
	infos, err := model.Layers(cfg.Model, layerConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]pipeline.LayerCost, len(infos))
	for i, in := range infos {
		f := blockMs / 10 * 1e-3
		if strings.HasPrefix(in.Describe, "block") {
			f = blockMs * 1e-3
		}
		out[i] = pipeline.LayerCost{Forward: f, Backward: 2 * f, Params: in.Params, Tied: in.Tied, TiedParams: in.TiedParams, OutElems: in.OutElems}
	}
	return out
}

// TestPlanStagesIsPlansFastest: the choice is pipeline.Plan's fastest
// layout for the same inputs (its number of stages and its cut): over slow
// links a hybrid layout (S > 1), over fast ones pure data parallelism
// (S = 1), which then carries no cut.
func TestPlanStagesIsPlansFastest(t *testing.T) {
	cfg := config.DefaultConfig().Train
	cfg.Model = "gpt"
	cfg.GPT = config.GPT{Layers: 8, DModel: 512, Heads: 8, Context: 128, Vocab: 256}
	costs := fakeCosts(t, cfg, 10)
	for _, tc := range []struct {
		name       string
		mbit, rtt  float64
		wantHybrid bool
	}{{"20 Mbit/s", 20, 2e-3, true}, {"100 Gbit/s", 100e3, 1e-5, false}} {
		t.Run(tc.name, func(t *testing.T) {
			in := stagesInput{Costs: costs, Peers: 4, Batch: 4 * 8, Micro: 4, Schedule: pipeline.OneFOneB,
				Links: linkSummary{Bandwidth: tc.mbit * 1e6 / 8, RTT: tc.rtt}, Grad: "none", Act: "dyn8"}
			got, layouts, err := planStages(in)
			if err != nil {
				t.Fatal(err)
			}
			grad, _ := pipeline.CodecCostOf("none")
			act, _ := pipeline.CodecCostOf("dyn8")
			want, err := pipeline.Setup{Layers: costs, Peers: 4, Batch: 32, Micro: 4, Bandwidth: tc.mbit * 1e6 / 8, RTT: tc.rtt,
				Schedule: pipeline.OneFOneB}.Plan([]pipeline.CodecCost{grad}, []pipeline.CodecCost{act})
			if err != nil {
				t.Fatal(err)
			}
			if got.Stages != want[0].Stages || !slices.Equal(got.Split, []int(want[0].Split)) || len(layouts) != len(want) {
				t.Fatalf("chose %v, Plan's fastest is %s split %v", got, want[0].Name(), want[0].Split)
			}
			if tc.wantHybrid != (got.Stages > 1) {
				t.Fatalf("chose %v over %s links; want a hybrid layout: %v", got, tc.name, tc.wantHybrid)
			}
			if err := got.check(); err != nil {
				t.Fatalf("the choice %v does not pass its own check: %v", got, err)
			}
			again, _, _ := planStages(in)
			if again.key() != got.key() {
				t.Fatalf("the same inputs chose %v, then %v", got, again)
			}
			t.Logf("%s: %v, projected %.3f s per step (%d layouts)", tc.name, got, layouts[0].Step, len(layouts))
		})
	}
}

// TestPlanStagesCountsIdleLayouts: 5 peers on slow links can choose a
// layout whose stages do not divide them (the last members idle), ranked
// by time per sample as pipeline.Plan ranks it with Idle and
// PerPeerBatch.
func TestPlanStagesCountsIdleLayouts(t *testing.T) {
	cfg := config.DefaultConfig().Train
	cfg.Model = "gpt"
	cfg.GPT = config.GPT{Layers: 8, DModel: 512, Heads: 8, Context: 128, Vocab: 256}
	costs := fakeCosts(t, cfg, 10)
	in := stagesInput{Costs: costs, Peers: 5, Batch: 5 * 8, PerPeerBatch: 8, Micro: 4, Schedule: pipeline.OneFOneB,
		Links: linkSummary{Bandwidth: 20e6 / 8, RTT: 2e-3}, Grad: "none", Act: "dyn8"}
	got, layouts, err := planStages(in)
	if err != nil {
		t.Fatal(err)
	}
	if got.Stages < 2 || 5%got.Stages == 0 || layouts[0].Idle == 0 {
		t.Fatalf("5 peers at 20 Mbit/s chose %v (%s); want a pipeline with idle members", got, layouts[0].Name())
	}
	if err := got.check(); err != nil {
		t.Fatal(err)
	}
	for _, l := range layouts {
		if want := (5 - l.Idle) * 8; l.Batch != want {
			t.Errorf("%s takes %d samples a step; want %d (8 per member that trains)", l.Name(), l.Batch, want)
		}
	}
	dp := slices.IndexFunc(layouts, func(l pipeline.Layout) bool { return l.Stages == 1 })
	t.Logf("5 peers at 20 Mbit/s: %v, %s, %.4f s per sample; dp×5 %.4f", got, layouts[0].Name(), layouts[0].Step/float64(layouts[0].Batch),
		layouts[dp].Step/float64(layouts[dp].Batch))
}

// TestPlanStagesOnTheLayoutsLinks: 4 peers in two racks (1 Gbit/s
// within, 20 Mbit/s across) whose epoch order alternates the racks: the
// ring's slowest edge is 20 Mbit/s, but the pipeline layout the planner
// makes puts each 2-stage pipeline's hop inside a rack, so with the
// measured rates 2×2 is projected on 1 Gbit/s hops and 20 Mbit/s rings,
// faster than on 20 Mbit/s everywhere.
func TestPlanStagesOnTheLayoutsLinks(t *testing.T) {
	cfg := config.DefaultConfig().Train
	cfg.Model = "gpt"
	cfg.GPT = config.GPT{Layers: 8, DModel: 512, Heads: 8, Context: 128, Vocab: 256}
	fast, slow := 1000e6/8, 20e6/8
	rack := []int{0, 1, 0, 1}
	bw := make(plan.Matrix, 4)
	for i := range bw {
		bw[i] = make([]float64, 4)
		for j := range bw[i] {
			if i != j {
				bw[i][j] = slow
				if rack[i] == rack[j] {
					bw[i][j] = fast
				}
			}
		}
	}
	in := stagesInput{Costs: fakeCosts(t, cfg, 10), Peers: 4, Batch: 4 * 8, Micro: 4, Schedule: pipeline.OneFOneB,
		Links: ringLinks([]string{"a", "b", "c", "d"}, bw, nil), Grad: "dyn8", Act: "dyn8"}
	if in.Links.Bandwidth != slow {
		t.Fatalf("the ring's slowest link: %v bytes/s, want %v", in.Links.Bandwidth, slow)
	}
	_, uniform, err := planStages(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Rates = bw
	_, racks, err := planStages(in)
	if err != nil {
		t.Fatal(err)
	}
	find := func(ls []pipeline.Layout, name string) pipeline.Layout {
		for _, l := range ls {
			if l.Name() == name {
				return l
			}
		}
		t.Fatalf("no layout %s", name)
		return pipeline.Layout{}
	}
	u, r := find(uniform, "2×2"), find(racks, "2×2")
	if r.HopRate != fast || r.RingRate != slow || !(r.Step < u.Step) {
		t.Errorf("2×2 on the racks' links: hops %v, rings %v bytes/s, step %v; on 20 Mbit/s everywhere %v", r.HopRate, r.RingRate, r.Step, u.Step)
	}
	if a, b := find(uniform, "dp×4"), find(racks, "dp×4"); a.Step != b.Step {
		t.Errorf("dp×4: %v s on the ring's links, %v with the rates", a.Step, b.Step)
	}
	t.Logf("2×2: %.3f s a step on the layout's links, %.3f s on the ring's slowest link everywhere", r.Step, u.Step)
}

// TestPlanStagesPricesTheProcessor: the processor's figures reach the
// projection: every layout's update is its largest stage's parameters
// times the optimizer's cost, and a codec's coding time, looked up by
// its canonical spec, raises the rings' time; a slow enough optimizer
// step and coding turn the choice from data parallelism (every peer
// updates the whole model) to a pipeline.
func TestPlanStagesPricesTheProcessor(t *testing.T) {
	cfg := config.DefaultConfig().Train
	cfg.Model = "gpt"
	cfg.GPT = config.GPT{Layers: 8, DModel: 512, Heads: 8, Context: 128, Vocab: 256}
	in := stagesInput{Costs: fakeCosts(t, cfg, 10), Peers: 4, Batch: 4 * 8, Micro: 4, Schedule: pipeline.OneFOneB,
		Links: linkSummary{Bandwidth: 10e9 / 8, RTT: 1e-4}, Grad: "dyn8", Act: "dyn8"}
	free, _, err := planStages(in)
	if err != nil {
		t.Fatal(err)
	}
	dyn8, err := pipeline.CodecCostOf("dyn8")
	if err != nil {
		t.Fatal(err)
	}
	in.CPU = pipeline.CPUCost{Update: 100e-9, Message: 1e-5, Byte: 1e-9}
	in.Code = map[string]float64{dyn8.Spec: 50e-9}
	got, layouts, err := planStages(in)
	if err != nil {
		t.Fatal(err)
	}
	if free.Stages != 1 || got.Stages == 1 {
		t.Errorf("chose %v without the processor's costs and %v with them; want data parallelism, then a pipeline", free, got)
	}
	for _, l := range layouts {
		if want := float64(l.PeerParams) * 100e-9; math.Abs(l.Update-want) > 1e-12 || !(l.CommCPU > 0) {
			t.Errorf("%s: update %g s (want %g), communication's processor time %g s", l.Name(), l.Update, want, l.CommCPU)
		}
	}
}

// TestRingLinks: the links assumed are the slowest rate and the longest
// RTT measured between neighbours of the ring (each direction, a reverse
// figure standing in), the defaults when none is measured.
func TestRingLinks(t *testing.T) {
	order := []string{"a", "b", "c", "d"}
	mb := func(mbit float64) float64 { return mbit * 1e6 / 8 }
	bw := plan.Matrix{
		{0, mb(100), mb(1), 0},
		{mb(100), 0, mb(50), 0},
		{mb(1), mb(40), 0, 0}, // c → b is slower than b → c
		{0, 0, 0, 0},          // nothing measured to or from d
	}
	rtt := plan.Matrix{{0, 2e-3, 0, 0}, {0, 0, 0, 0}, {0, 9e-3, 0, 0}, {0, 0, 0, 0}}
	s := ringLinks(order, bw, rtt)
	// Edges a-b, b-c, c-d, d-a: a-c (1 Mbit/s) is not a neighbour pair.
	if s.Edges != 4 || s.Measured != 2 || s.Bandwidth != mb(40) || s.RTT != 9e-3 || !s.RTTMeasured {
		t.Fatalf("got %+v; want 2 of 4 edges measured, 40 Mbit/s, RTT 9 ms", s)
	}
	none := ringLinks(order, make(plan.Matrix, 4), nil)
	if none.Measured != 0 || none.Bandwidth != defaultLinkMbit*1e6/8 || none.RTT != defaultLinkRTT.Seconds() {
		t.Fatalf("nothing measured: %+v; want the defaults", none)
	}
	if two := ringLinks(order[:2], plan.Matrix{{0, mb(10)}, {0, 0}}, nil); two.Edges != 1 || two.Bandwidth != mb(10) {
		t.Fatalf("two members: %+v; want one edge at 10 Mbit/s", two)
	}
	if one := ringLinks(order[:1], plan.Matrix{{0}}, nil); one.Edges != 0 || one.Bandwidth != defaultLinkMbit*1e6/8 {
		t.Fatalf("one member: %+v; want no edge and the default", one)
	}
}

// TestAutoSettingsRefuseFixedStages: a peer of train.pipeline_stages =
// "auto" and one of a fixed number do not train together, and the one in
// the minority is told the key.
func TestAutoSettingsRefuseFixedStages(t *testing.T) {
	auto := testSettings(t, func(c *config.Train, _ *config.Allreduce) { c.PipelineStages = config.StagesAuto })
	autoSettings(auto, config.DefaultConfig().Train)
	for _, fixed := range []config.Stages{1, 2} {
		other := testSettings(t, func(c *config.Train, _ *config.Allreduce) { c.PipelineStages = fixed })
		ep := gossip.Epoch{Number: 3, Order: []string{"a", "b", "c"}, Coordinator: "a"}
		members := settingsMembers(map[string]Settings{"a": other.cluster(), "b": other.cluster(), "c": auto.cluster()})
		_, err := checkSettings(auto.cluster(), "c", members, ep)
		if !errors.Is(err, ErrSettingsDiffer) || !strings.Contains(err.Error(), "train.pipeline_stages = auto here, "+fixed.String()+" there") {
			t.Errorf("auto among pipeline_stages = %v: %v; want ErrSettingsDiffer naming train.pipeline_stages", fixed, err)
		}
	}
	// The key does not change the resume hash of pure data parallelism.
	if testSettings(t, nil).resumeHash() != testSettings(t, func(c *config.Train, _ *config.Allreduce) { c.PipelineStages = 2 }).resumeHash() {
		t.Error("train.pipeline_stages changes the resume hash")
	}
}

// TestStagesChoiceInPayload: a choice survives a heartbeat, and a choice
// no peer can have made is refused with the payload.
func TestStagesChoiceInPayload(t *testing.T) {
	c := &StagesChoice{Stages: 2, Split: []int{0, 3, 7}, Epoch: 4, Digest: "0123456789abcdef", Holders: []string{"a", "b"}, Step: 9}
	p, err := DecodePayload(Payload{Stages: c}.Encode())
	if err != nil || p.Stages == nil || p.Stages.key() != c.key() || p.Stages.Epoch != 4 || !slices.Equal(p.Stages.Holders, c.Holders) || p.Stages.Step != 9 {
		t.Fatalf("round trip: %+v, %v", p.Stages, err)
	}
	// A re-plan from a pipeline into data parallelism.
	dp := &StagesChoice{Stages: 1, Holders: []string{"a", "b"}, Step: 9, From: []int{0, 3, 7}, HolderStages: []int{1, 0}, StageHashes: []string{"h0", "h1"}}
	if p, err := DecodePayload(Payload{Stages: dp}.Encode()); err != nil || !slices.Equal(p.Stages.From, dp.From) ||
		!slices.Equal(p.Stages.HolderStages, dp.HolderStages) || !slices.Equal(p.Stages.StageHashes, dp.StageHashes) {
		t.Fatalf("a re-plan from a pipeline, round trip: %+v, %v", p.Stages, err)
	}
	from := func(f func(c *StagesChoice)) StagesChoice {
		c := *dp
		f(&c)
		return c
	}
	for _, bad := range []StagesChoice{
		{Stages: 0}, {Stages: 300}, {Stages: 1, Split: []int{0, 7}}, {Stages: 2, Split: []int{0, 7}},
		{Stages: 2, Split: []int{0, 5, 5}}, {Stages: 2, Split: []int{1, 3, 7}},
		{Stages: 1, Holders: []string{"a"}, Step: 3}, // a re-plan into data parallelism, from none
		from(func(c *StagesChoice) { c.From = []int{0, 7} }),
		from(func(c *StagesChoice) { c.From = []int{0, 3, 3} }),
		from(func(c *StagesChoice) { c.HolderStages = []int{1} }),
		from(func(c *StagesChoice) { c.HolderStages = []int{2, 0} }),
		from(func(c *StagesChoice) { c.StageHashes = []string{"h0"} }),
		from(func(c *StagesChoice) { c.StageHashes = []string{"h0", strings.Repeat("x", 65)} }),
		from(func(c *StagesChoice) { c.Holders, c.HolderStages = nil, nil }),
		from(func(c *StagesChoice) { c.Step = 0 }),
		{Stages: 2, Split: []int{0, 3, 7}, Holders: []string{"a", "b"}}, // holders of no step
		{Stages: 2, Split: []int{0, 3, 7}, Holders: make([]string, 513), Step: 3},
		{Stages: 2, Split: []int{0, 3, 7}, Holders: []string{strings.Repeat("x", 129)}, Step: 3},
	} {
		if _, err := DecodePayload(Payload{Stages: &bad}.Encode()); err == nil {
			t.Errorf("choice %+v accepted", bad)
		}
	}
}

// linkCluster is a node whose measured links all read mbit Mbit/s and
// rttMs ms, in its link matrix and in the figures the members gossip.
type linkCluster struct {
	*node.Node
	mbit, rttMs float64
}

func (c linkCluster) LinkMatrix(order []string) plan.Matrix {
	m := make(plan.Matrix, len(order))
	for i := range m {
		m[i] = make([]float64, len(order))
		for j := range m[i] {
			if i != j {
				m[i][j] = c.mbit * 1e6 / 8
			}
		}
	}
	return m
}

func (c linkCluster) View() ([]gossip.Member, gossip.Epoch) {
	members, ep := c.Node.View()
	for i := range members {
		members[i].Links = nil
		for _, o := range members {
			if o.PeerID != members[i].PeerID {
				members[i].Links = append(members[i].Links, gossip.LinkFigure{Peer: o.PeerID, MbitS: c.mbit, RTTMs: c.rttMs})
			}
		}
	}
	return members, ep
}

// autoGPT returns the configuration of a gpt run of steps steps over
// peers peers of batch samples each, with 2 micro-batches and exact
// activations, for startAuto (which sets train.pipeline_stages).
func autoGPT(steps, peers, batch int) func(boot ...string) config.Config {
	return func(boot ...string) config.Config {
		c := gptConfig(steps, peers, batch, boot...)
		c.Train.MicroBatches = 2
		c.Train.ActivationCodec = "none"
		return c
	}
}

// startAuto starts peers trainers of cfg (its train.pipeline_stages set to
// "auto", train.min_peers to peers) on links of mbit Mbit/s and rttMs ms,
// with the layer costs costs (nil: timed on this machine).
func startAuto(t *testing.T, peers int, cfg func(boot ...string) config.Config, mbit, rttMs float64, costs []pipeline.LayerCost,
	opts ...func(peer int, o *Options)) []*trainPeer {
	t.Helper()
	var ps []*trainPeer
	for i := range peers {
		c := cfg(bootstrapTo(ps)...)
		c.Train.PipelineStages, c.Train.MinPeers = config.StagesAuto, peers
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, startTrainerOptions(t, c, nil, nil, func(n *node.Node) Cluster { return linkCluster{n, mbit, rttMs} },
			func(o *Options) {
				o.LayerCosts = costs
				for _, f := range opts {
					f(i, o)
				}
			}))
	}
	for _, p := range ps {
		p.wait(t, 3*time.Minute)
		if p.err != nil {
			t.Fatalf("peer %s: %v", p.n.ID(), p.err)
		}
	}
	return ps
}

// TestAutoStagesChooseHybridOnSlowLinks: 4 peers of train.pipeline_stages
// = "auto" on slow links (2 Mbit/s, RTT 20 ms), with injected layer costs,
// all train with the choice of one party, which is planStages' (and so
// pipeline.Plan's) fastest for the inputs the coordinator had: a hybrid
// layout. Every peer ends at the last step, the replicas of each stage
// bit-identical.
func TestAutoStagesChooseHybridOnSlowLinks(t *testing.T) {
	const steps, batch = 8, 4
	cfg := autoGPT(steps, 4, batch)
	costs := fakeCosts(t, cfg().Train, 5)
	want, _, err := planStages(stagesInput{Costs: costs, Peers: 4, Batch: 4 * batch, Micro: 2, Schedule: pipeline.OneFOneB,
		Links: linkSummary{Bandwidth: 2e6 / 8, RTT: 20e-3}, Grad: "none", Act: "none"})
	if err != nil || want.Stages < 2 {
		t.Fatalf("the inputs choose %v, %v: the test needs them to choose a hybrid layout", want, err)
	}
	ps := startAuto(t, 4, cfg, 2, 20, costs)
	byStage := map[int][]*trainPeer{}
	for _, p := range ps {
		c := p.tr.auto.choice
		if c == nil || c.key() != want.key() {
			t.Fatalf("peer %s trained with %v; want %v", p.n.ID(), c, want)
		}
		if p.res.Step != steps {
			t.Fatalf("peer %s ended at step %d", p.n.ID(), p.res.Step)
		}
		s := stagePeer(t, p).Stage()
		if got := stagePeer(t, p).Split(); !slices.Equal([]int(got), want.Split) {
			t.Fatalf("peer %s cut the model at %v; the choice says %v", p.n.ID(), got, want.Split)
		}
		byStage[s] = append(byStage[s], p)
	}
	if len(byStage) != want.Stages {
		t.Fatalf("the peers hold %d stages; the choice has %d", len(byStage), want.Stages)
	}
	for _, sp := range byStage {
		sameResult(t, sp, steps)
	}
	t.Logf("all 4 peers trained with %v", want)
}

// TestAutoStagesOneStageIsDataParallelism: 2 peers of "auto" on fast
// links (10 Gbit/s, RTT 0.01 ms), with their layers timed on this machine
// at start, choose one stage (over free links a pipeline's recomputation
// and bubble only cost) and end with the parameters of 2 peers of plain
// data parallelism, bit for bit: timing the layers leaves the model as it
// was, and the run trains exactly as data parallelism does.
func TestAutoStagesOneStageIsDataParallelism(t *testing.T) {
	const steps, batch = 10, 4
	cfg := func(boot ...string) config.Config { return gptConfig(steps, 2, batch, boot...) }
	// Peer 0 times the real transport, peer 1's timing fails: it trains
	// all the same, pricing no processor time for messages.
	auto := startAuto(t, 2, cfg, 10e3, 0.01, nil, func(i int, o *Options) {
		o.MeasureWire = func(ctx context.Context) (float64, float64, error) {
			if i == 1 {
				return 1, 1, errors.New("no loopback here")
			}
			w, err := node.MeasureWireCost(ctx, nil, "", 20)
			return w.Message, w.Byte, err
		}
	})
	for i, p := range auto {
		if c := p.tr.auto.choice; c == nil || c.Stages != 1 {
			t.Fatalf("peer %s chose %v over free links; want 1 stage", p.n.ID(), c)
		}
		if cpu := p.tr.auto.cpu; !(cpu.Update > 0) || (i == 0) != (cpu.Message > 0 && cpu.Byte > 0) || i == 1 && (cpu.Message != 0 || cpu.Byte != 0) ||
			len(p.tr.auto.code) != 2 {
			t.Errorf("peer %d's processor figures: %+v, codecs %v", i, cpu, p.tr.auto.code)
		}
		if _, ok := p.tr.l.(*ModelLearner); !ok {
			t.Fatalf("peer %s trains a %T, not the whole model", p.n.ID(), p.tr.l)
		}
	}
	var dp []*trainPeer
	for range 2 {
		dp = append(dp, startTrainer(t, cfg(bootstrapTo(dp)...), nil))
	}
	for _, p := range dp {
		p.wait(t, 3*time.Minute)
	}
	want := sameResult(t, dp, steps)
	if got := sameResult(t, auto, steps); got.ParamHash != want.ParamHash || math.Abs(got.Loss-want.Loss) != 0 {
		t.Fatalf("auto with one stage ended with hash %s loss %v; data parallelism with %s loss %v", got.ParamHash, got.Loss, want.ParamHash, want.Loss)
	}
}

// TestAutoStagesWithAnIdleMember: 3 peers of "auto" on slow links (2
// Mbit/s, RTT 20 ms) with injected layer costs choose 2 stages, which do
// not divide them: one pipeline trains, the third member sits idle, and
// every peer ends at the last step with the final state of the stage it
// holds.
func TestAutoStagesWithAnIdleMember(t *testing.T) {
	const steps, batch = 8, 4
	cfg := autoGPT(steps, 3, batch)
	costs := fakeCosts(t, cfg().Train, 5)
	want, _, err := planStages(stagesInput{Costs: costs, Peers: 3, Batch: 3 * batch, PerPeerBatch: batch, Micro: 2, Schedule: pipeline.OneFOneB,
		Links: linkSummary{Bandwidth: 2e6 / 8, RTT: 20e-3}, Grad: "none", Act: "none"})
	if err != nil || want.Stages != 2 {
		t.Fatalf("the inputs choose %v, %v: the test needs them to choose 2 stages of 3 peers", want, err)
	}
	ps := startAuto(t, 3, cfg, 2, 20, costs)
	idle := 0
	byStage := map[int][]*trainPeer{}
	for _, p := range ps {
		if c := p.tr.auto.choice; c == nil || c.key() != want.key() {
			t.Fatalf("peer %s trained with %v; want %v", p.n.ID(), c, want)
		}
		if p.res.Step != steps {
			t.Fatalf("peer %s ended at step %d", p.n.ID(), p.res.Step)
		}
		if p.tr.idleLogged.Load() != 0 {
			idle++
		}
		s := stagePeer(t, p).Stage()
		byStage[s] = append(byStage[s], p)
	}
	if idle == 0 || len(byStage) != 2 {
		t.Fatalf("%d peers said they were idle, %d stages held; want an idle peer and both stages", idle, len(byStage))
	}
	for _, sp := range byStage {
		sameResult(t, sp, steps)
	}
}

// varLinks is linkCluster whose links' rate (Mbit/s, as float64 bits)
// the test changes while the peers run.
type varLinks struct {
	*node.Node
	mbit  *atomic.Uint64
	rttMs float64
}

func (c varLinks) now() linkCluster {
	return linkCluster{c.Node, math.Float64frombits(c.mbit.Load()), c.rttMs}
}

func (c varLinks) LinkMatrix(order []string) plan.Matrix { return c.now().LinkMatrix(order) }

func (c varLinks) View() ([]gossip.Member, gossip.Epoch) { return c.now().View() }

// TestAutoStagesReplanFromDataParallelism: 2 peers of "auto" on fast
// links train with data parallelism; then their links read 0.5 Mbit/s and
// a third peer joins. The coordinator of the new epoch projects a
// pipeline at least 1.25× faster per sample and announces it; the two
// cut their whole models into their stages at the step they hold (no
// state is lost: the loss goes on from where data parallelism left it),
// the joiner fetches its stage, and all three end at the last step with
// each stage's holders identical.
func TestAutoStagesReplanFromDataParallelism(t *testing.T) {
	const steps, batch, switchAfter = 300, 4, 8
	cfg := replanGPT(steps, batch)
	costs := fakeCosts(t, cfg().Train, 2)
	want, _, err := planStages(stagesInput{Costs: costs, Peers: 3, Batch: 3 * batch, PerPeerBatch: batch, Micro: 2, Schedule: pipeline.OneFOneB,
		Links: linkSummary{Bandwidth: 0.5e6 / 8, RTT: 20e-3}, Grad: "none", Act: "none"})
	if err != nil || want.Stages < 2 {
		t.Fatalf("3 peers at 0.5 Mbit/s choose %v, %v: the test needs a pipeline", want, err)
	}
	ps := replanScenario(t, cfg, costs, 10e3, 0.5, switchAfter, steps, want)
	byStage := map[int][]*trainPeer{}
	for _, p := range ps {
		byStage[stagePeer(t, p).Stage()] = append(byStage[stagePeer(t, p).Stage()], p)
	}
	for _, sp := range byStage {
		sameResult(t, sp, steps)
	}
	checkCarriedOver(t, ps, steps, switchAfter, "data parallelism", want)
}

// replanGPT is autoGPT for replanScenario: train.pipeline_stages =
// "auto" with train.min_peers = 2, so that the first two peers choose
// before the third joins.
func replanGPT(steps, batch int) func(boot ...string) config.Config {
	return func(boot ...string) config.Config {
		c := autoGPT(steps, 2, batch)(boot...)
		c.Train.PipelineStages, c.Train.MinPeers = config.StagesAuto, 2
		return c
	}
}

// replanScenario starts 2 peers of cfg (train.pipeline_stages = "auto")
// with the layer costs costs on links of mbit Mbit/s; once the first
// reaches step switchAfter, the links read then Mbit/s and a third peer
// joins. It returns the three after they ended at step steps with the
// choice want.
func replanScenario(t *testing.T, cfg func(boot ...string) config.Config, costs []pipeline.LayerCost, mbit, then float64, switchAfter, steps int,
	want StagesChoice) []*trainPeer {
	t.Helper()
	var rate atomic.Uint64
	rate.Store(math.Float64bits(mbit))
	start := func(boot ...string) *trainPeer {
		return startTrainerOptions(t, cfg(boot...), nil, nil, func(n *node.Node) Cluster { return varLinks{n, &rate, 20} },
			func(o *Options) { o.LayerCosts = costs })
	}
	var ps []*trainPeer
	for range 2 {
		ps = append(ps, start(bootstrapTo(ps)...))
	}
	deadline := time.Now().Add(2 * time.Minute)
	for ps[0].step() < uint64(switchAfter) {
		if time.Now().After(deadline) {
			t.Fatalf("the first choice did not reach step %d", switchAfter)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rate.Store(math.Float64bits(then))
	ps = append(ps, start(bootstrapTo(ps)...))
	for i, p := range ps {
		p.wait(t, 3*time.Minute)
		if p.err != nil || p.res.Step != uint64(steps) {
			t.Fatalf("peer %d: step %d, %v", i, p.res.Step, p.err)
		}
		if c := p.tr.auto.choice; c == nil || c.key() != want.key() {
			t.Fatalf("peer %d trained with %v at the end; want %v", i, c, want)
		}
	}
	return ps
}

// checkCarriedOver checks that the first two of ps re-planned from was
// into want at one step, at least switchAfter, and that the loss of the
// first step of want continues from the last of was rather than starting
// over.
func checkCarriedOver(t *testing.T, ps []*trainPeer, steps, switchAfter int, was string, want StagesChoice) {
	t.Helper()
	cut := ps[0].tr.auto.recutAt
	if cut < uint64(switchAfter) || ps[1].tr.auto.recutAt != cut {
		t.Fatalf("the first two peers re-planned at steps %d and %d; want the same step, at least %d", cut, ps[1].tr.auto.recutAt, switchAfter)
	}
	losses := stepLosses(ps, steps)
	first, before, after := losses[0], losses[cut-1], losses[cut]
	t.Logf("loss %.3f at step 1, %.3f at step %d (%s), %.3f at step %d (%v), %.3f at step %d", first, before, cut, was, after, cut+1, want, losses[steps-1], steps)
	if !(after < first-0.5*(first-before)) {
		t.Errorf("the first step's loss after the re-plan, %.3f, is nearer step 1's %.3f than the last one's before it, %.3f: the state was not carried over", after, first, before)
	}
}

// TestPipelineIdleMember: 5 peers with train.pipeline_stages = 2 form 2
// pipelines of 2 and leave the fifth idle: it says so, keeps its state,
// and when the pipelines reach the last step it takes its stage's final
// state, so every peer ends at the last step and the holders of each
// stage, the idle one included, end bit-identical.
func TestPipelineIdleMember(t *testing.T) {
	const steps, batch = 12, 4
	var ps []*trainPeer
	for range 5 {
		ps = append(ps, startTrainer(t, pipeConfig(steps, 5, batch, 2, bootstrapTo(ps)...), nil))
	}
	for _, p := range ps {
		p.wait(t, 3*time.Minute)
		if p.err != nil {
			t.Fatalf("peer %s: %v", p.n.ID(), p.err)
		}
	}
	idle := 0
	byStage := map[int][]*trainPeer{}
	for _, p := range ps {
		if p.res.Step != steps {
			t.Fatalf("peer %s ended at step %d, want %d", p.n.ID(), p.res.Step, steps)
		}
		if p.tr.idleLogged.Load() != 0 {
			idle++
		}
		s := stagePeer(t, p).Stage()
		byStage[s] = append(byStage[s], p)
	}
	if idle == 0 {
		t.Fatal("no peer said it was idle, with 5 members and 2 stages")
	}
	if len(byStage) != 2 || len(byStage[0])+len(byStage[1]) != 5 {
		t.Fatalf("stages held at the end: %d and %d peers", len(byStage[0]), len(byStage[1]))
	}
	for _, sp := range byStage {
		sameResult(t, sp, steps)
	}
	trained := 0
	for _, p := range ps {
		p.mu.Lock()
		if len(p.progress) > 0 {
			trained++
		}
		p.mu.Unlock()
	}
	t.Logf("%d peer(s) sat idle in an epoch, %d trained steps; stage 0 held by %d peers, stage 1 by %d at the end",
		idle, trained, len(byStage[0]), len(byStage[1]))
}

// step returns the last step p reported progress for (0: none yet).
func (p *trainPeer) step() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.progress) == 0 {
		return 0
	}
	return p.progress[len(p.progress)-1].Step
}

// TestAutoStagesIdlesTheSlowMember: 3 peers of "auto" on fast links, the
// third computing 3× slower than the others (its injected layer costs,
// which it announces). Without compute figures the projection picks data
// parallelism; with them data parallelism computes at the slow member's
// pace, and the choice is a pipeline of the two fast peers that leaves
// the slow one idle. The epoch the choice is made in was ordered before
// the planner knew of stages, so the slow peer may train in it; the ring
// planner then re-plans (plan.SlowMembers), and the slow peer sits idle
// until the end while the others train every remaining step.
func TestAutoStagesIdlesTheSlowMember(t *testing.T) {
	const steps, batch = 60, 4
	cfg := autoGPT(steps, 3, batch)
	costs, slow := fakeCosts(t, cfg().Train, 5), fakeCosts(t, cfg().Train, 15)
	in := stagesInput{Costs: costs, Peers: 3, Batch: 3 * batch, PerPeerBatch: batch, Micro: 2, Schedule: pipeline.OneFOneB,
		Links: linkSummary{Bandwidth: 10e9 / 8, RTT: 0.2e-3}, Grad: "none", Act: "none"}
	if c, _, err := planStages(in); err != nil || c.Stages != 1 {
		t.Fatalf("3 equal peers on fast links choose %v, %v: the test needs data parallelism", c, err)
	}
	in.Compute = []float64{perSample(costs), perSample(costs), perSample(slow)}
	want, layouts, err := planStages(in)
	if err != nil || want.Stages != 2 || layouts[0].Idle != 1 {
		t.Fatalf("with a 3× slower peer the inputs choose %v, %v: the test needs 2 stages and the slow peer idle", want, err)
	}
	ps := startAuto(t, 3, cfg, 10e3, 0.2, costs, func(peer int, o *Options) {
		if peer == 2 {
			o.LayerCosts = slow
		}
	})
	lastTrained := func(p *trainPeer) uint64 {
		p.mu.Lock()
		defer p.mu.Unlock()
		var last uint64
		for _, pr := range p.progress {
			last = max(last, pr.Step)
		}
		return last
	}
	for i, p := range ps {
		if c := p.tr.auto.choice; c == nil || c.key() != want.key() {
			t.Fatalf("peer %d trained with %v; want %v", i, c, want)
		}
		if p.res.Step != steps {
			t.Fatalf("peer %d ended at step %d", i, p.res.Step)
		}
		last := lastTrained(p)
		t.Logf("peer %d: last step trained %d", i, last)
		if i == 2 && (last >= steps/2 || p.tr.idleLogged.Load() == 0) {
			t.Errorf("the slow peer trained up to step %d of %d and said it was idle in epoch %d: want it idle from early on", last, steps, p.tr.idleLogged.Load())
		}
		if i < 2 && last != steps {
			t.Errorf("fast peer %d trained up to step %d, want %d", i, last, steps)
		}
	}
}

// TestAutoStagesReplanFromPipeline: 2 peers of "auto" on slow links train
// a pipeline of 2 stages; then their links read 10 Gbit/s and a third
// peer joins. The coordinator of the new epoch projects data parallelism
// at least 1.25× faster per sample and announces it; the two join their
// stages' states (each fetching the other's over the stage-state
// protocol) into the whole model at the step they hold (no state is lost:
// the loss goes on from where the pipeline left it), the joiner fetches
// the whole model, and all three end at the last step identical.
func TestAutoStagesReplanFromPipeline(t *testing.T) {
	const steps, batch, switchAfter = 200, 4, 8
	cfg := replanGPT(steps, batch)
	costs := fakeCosts(t, cfg().Train, 2)
	in := stagesInput{Costs: costs, Peers: 2, Batch: 2 * batch, PerPeerBatch: batch, Micro: 2, Schedule: pipeline.OneFOneB,
		Links: linkSummary{Bandwidth: 0.5e6 / 8, RTT: 20e-3}, Grad: "none", Act: "none"}
	first, _, err := planStages(in)
	if err != nil || first.Stages != 2 {
		t.Fatalf("2 peers at 0.5 Mbit/s choose %v, %v: the test needs a pipeline of 2", first, err)
	}
	in.Peers, in.Batch, in.Links = 3, 3*batch, linkSummary{Bandwidth: 10e9 / 8, RTT: 20e-3}
	want, _, err := planStages(in)
	if err != nil || want.Stages != 1 {
		t.Fatalf("3 peers at 10 Gbit/s choose %v, %v: the test needs data parallelism", want, err)
	}
	ps := replanScenario(t, cfg, costs, 0.5, 10e3, switchAfter, steps, want)
	sameResult(t, ps, steps)
	checkCarriedOver(t, ps, steps, switchAfter, first.String(), want)
}

// TestFitHolders: a re-plan's announcement is trimmed to fit a heartbeat
// (a larger payload every member would refuse): 100 holders of a
// pipeline of 2 stages keep a holder of each stage and at least the new
// choice's stages; an announcement that cannot fit is refused.
func TestFitHolders(t *testing.T) {
	id := "12D3KooW" + strings.Repeat("x", 44)
	h := strings.Repeat("a", 64)
	c := StagesChoice{Stages: 2, Split: []int{0, 3, 5}, Epoch: 3, Digest: h, Step: 9, From: []int{0, 2, 5}, StageHashes: []string{h, h}}
	for i := range 100 {
		c.Holders = append(c.Holders, fmt.Sprint(id, i))
		c.HolderStages = append(c.HolderStages, min(i/99, 1)) // stage 1's only holder is the last
	}
	base := Payload{Ready: &Ready{Epoch: 3, Digest: h, Step: 9, Hash: h}, Settings: Settings{"train.model": "gpt"}}
	if !fitHolders(&c, base) {
		t.Fatal("100 holders could not be trimmed to fit")
	}
	p := base
	p.Stages = &c
	if n := len(p.Encode()); n > gossip.MaxAppBytes || len(c.Holders) < c.Stages || !slices.Contains(c.HolderStages, 1) || !slices.Contains(c.HolderStages, 0) {
		t.Errorf("trimmed to %d holders (stages %v), a payload of %d bytes", len(c.Holders), c.HolderStages, n)
	}
	if err := c.check(); err != nil {
		t.Errorf("the trimmed choice fails its check: %v", err)
	}
	huge := StagesChoice{Stages: 1, Holders: []string{"a", "b"}, Step: 9, From: []int{0}, HolderStages: []int{0, 1}}
	for s := range 70 {
		huge.From = append(huge.From, s+1)
		huge.StageHashes = append(huge.StageHashes, h)
	}
	if fitHolders(&huge, base) {
		t.Error("70 stage hashes fit a heartbeat")
	}
}
