package plan

import (
	"math"
	"slices"
	"testing"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/gossip"
)

// defaultSettings are the [allreduce] defaults.
func defaultSettings() Settings {
	return Settings{Schedule: "auto", BucketBytes: allreduce.DefaultBucketBytes, Codec: "none", LinkCodecs: LinkCodecsAuto}
}

// links makes members whose heartbeats report mbit[i][j] from ids[i] to ids[j]
// (0: not measured).
func linkMembers(ids []string, mbit [][]float64) []gossip.Member {
	var out []gossip.Member
	for i, id := range ids {
		m := gossip.Member{Heartbeat: gossip.Heartbeat{PeerID: id}}
		for j, v := range mbit[i] {
			if j != i && v > 0 {
				m.Links = append(m.Links, gossip.LinkFigure{Peer: ids[j], MbitS: v, RTTMs: 0.1})
			}
		}
		out = append(out, m)
	}
	return out
}

// TestPlannerIgnoresAbsurdFigures: figures that overflow bytes/s count as unknown.
func TestPlannerIgnoresAbsurdFigures(t *testing.T) {
	ids := []string{"a", "b", "c"}
	mbit := fastRing(3, []int{0, 1, 2}, math.MaxFloat64, math.MaxFloat64)
	p := NewPlanner(defaultSettings())
	if plan := p.Plan(ids, linkMembers(ids, mbit)); !slices.Equal(plan.Order, ids) || plan.Schedule != "auto" {
		t.Fatalf("plan %+v", plan)
	}
}

func TestPlannerNoFiguresKeepsPeerIDOrder(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	p := NewPlanner(defaultSettings())
	plan := p.Plan(ids, linkMembers(ids, make([][]float64, 4)))
	if !slices.Equal(plan.Order, ids) || plan.Schedule != "auto" || plan.Shares != nil {
		t.Fatalf("plan %+v without measurements, want the peer-ID order and auto", plan)
	}
	if p.Replan(gossip.Epoch{Number: 1, Order: ids, Coordinator: "a"}, plan, linkMembers(ids, make([][]float64, 4))) {
		t.Fatal("replan without measurements")
	}
}

// TestPlannerRing checks that the planner orders the ring as
// RingOrder does over the measured matrix, and re-plans only from
// a complete matrix.
func TestPlannerRing(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	// Fast ring a → c → b → d → a (1000 Mbit/s), everything else 100 Mbit/s.
	mbit := fastRing(4, []int{0, 2, 1, 3}, 1000, 100)
	members := linkMembers(ids, mbit)
	p := NewPlanner(defaultSettings())
	plan := p.Plan(ids, members)
	want := orderOf(ids, RingOrder(mbitMatrix(mbit)))
	if !slices.Equal(plan.Order, want) || plan.Schedule != "auto" {
		t.Fatalf("plan %+v, want order %v with auto", plan, want)
	}
	if !slices.Equal(want, []string{"a", "c", "b", "d"}) && !slices.Equal(want, []string{"a", "d", "b", "c"}) {
		t.Fatalf("RingOrder %v misses the fast ring", want)
	}
	cur := gossip.Epoch{Number: 3, Order: ids, Coordinator: "a", Schedule: "auto"}
	if !p.Replan(cur, plan, members) {
		t.Fatal("no replan although the slowest edge gets 10× faster")
	}
	// One pair unmeasured (in both directions): wait for it.
	mbit[0][1], mbit[1][0] = 0, 0
	if p.Replan(cur, p.Plan(ids, linkMembers(ids, mbit)), linkMembers(ids, mbit)) {
		t.Fatal("replan from an incomplete matrix")
	}
	// One direction suffices.
	mbit[0][1] = 100
	if !p.Replan(cur, p.Plan(ids, linkMembers(ids, mbit)), linkMembers(ids, mbit)) {
		t.Fatal("no replan when every pair is known in one direction")
	}
	// Noise within the quantisation step: no replan.
	noisy := fastRing(4, []int{0, 1, 2, 3}, 1000, 1000)
	noisy[1][2], noisy[3][0] = 900, 1080
	if p.Replan(cur, p.Plan(ids, linkMembers(ids, noisy)), linkMembers(ids, noisy)) {
		t.Fatal("replan on measurement noise")
	}
}

// TestPlannerSlowNIC: one peer at 100 Mbit/s, three at 1 Gbit/s; with
// schedule auto the plan is the proportional schedule, with the slow peer
// owning the least.
func TestPlannerSlowNIC(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	mbit := make([][]float64, 4)
	for i := range mbit {
		mbit[i] = make([]float64, 4)
		for j := range mbit[i] {
			if i != j {
				mbit[i][j] = 1000
				if i == 1 || j == 1 {
					mbit[i][j] = 100
				}
			}
		}
	}
	members := linkMembers(ids, mbit)
	cfg := defaultSettings()
	cfg.LinkCodecs = LinkCodecsOff // else fp16 on b's links beats the shares (TestPlannerLinkCodecs)
	p := NewPlanner(cfg)
	plan := p.Plan(ids, members)
	if plan.Schedule != "proportional" || len(plan.Shares) != 4 {
		t.Fatalf("plan %+v, want the proportional schedule", plan)
	}
	sum := 0.0
	for k, id := range plan.Order {
		sum += plan.Shares[k]
		if id == "b" && plan.Shares[k] > 0.1 {
			t.Fatalf("slow peer b owns %v of the buffer", plan.Shares[k])
		}
	}
	if sum < 1-1e-9 || sum > 1+1e-9 {
		t.Fatalf("shares sum to %v", sum)
	}
	e := gossip.Epoch{Number: 2, Order: plan.Order, Coordinator: "a", Schedule: plan.Schedule, Shares: plan.Shares}
	// The plan makes a valid epoch on the wire.
	wire, err := gossip.Encode(&gossip.Envelope{V: gossip.WireVersion, Cluster: "c", Type: gossip.TypeEpoch, Epoch: &e})
	if err == nil {
		_, err = gossip.Decode(wire, "c", "a")
	}
	if err != nil {
		t.Fatalf("planned epoch %+v: %v", e, err)
	}
	if !p.Replan(gossip.Epoch{Number: 1, Order: ids, Coordinator: "a", Schedule: "auto"}, plan, members) {
		t.Fatal("no replan to the proportional schedule")
	}
	// An explicit schedule wins.
	cfg.Schedule = "ring"
	if plan := NewPlanner(cfg).Plan(ids, members); plan.Schedule != "ring" || plan.Shares != nil {
		t.Fatalf("plan %+v with allreduce.schedule = ring", plan)
	}
	cfg.Schedule = "proportional"
	if plan := NewPlanner(cfg).Plan(ids, members); plan.Schedule != "proportional" || len(plan.Shares) != 4 {
		t.Fatalf("plan %+v with allreduce.schedule = proportional", plan)
	}
}

// fastRing returns an n×n Mbit/s table with fast on the edges of ring (both
// directions) and slow elsewhere.
func fastRing(n int, ring []int, fast, slow float64) [][]float64 {
	m := make([][]float64, n)
	for i := range m {
		m[i] = make([]float64, n)
		for j := range m[i] {
			if i != j {
				m[i][j] = slow
			}
		}
	}
	for k, i := range ring {
		j := ring[(k+1)%len(ring)]
		m[i][j], m[j][i] = fast, fast
	}
	return m
}

func mbitMatrix(mbit [][]float64) Matrix {
	m := make(Matrix, len(mbit))
	for i := range mbit {
		m[i] = make([]float64, len(mbit[i]))
		for j, v := range mbit[i] {
			m[i][j] = v * 1e6 / 8
		}
	}
	return m
}

func orderOf(ids []string, o []int) []string {
	out := make([]string, len(o))
	for k, i := range o {
		out[k] = ids[i]
	}
	return out
}

// slowPeer returns an n×n Mbit/s table where peer 0's links run at slow
// and every other link at fast.
func slowPeer(n int, slow, fast float64) [][]float64 {
	m := fastRing(n, nil, fast, fast)
	for j := 1; j < n; j++ {
		m[0][j], m[j][0] = slow, slow
	}
	return m
}

// TestPlannerLinkCodecs: with the ring schedule, the links of a slow peer
// get the stronger codec of the configured family, the all-gather too, and
// that layout is worth a re-plan of an epoch without it.
func TestPlannerLinkCodecs(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	members := linkMembers(ids, slowPeer(4, 100, 1000))
	cfg := defaultSettings()
	cfg.Schedule = "ring"
	plan := NewPlanner(cfg).Plan(ids, members)
	if plan.FinalCodec != "fp16" || len(plan.LinkCodecs) != 4 {
		t.Fatalf("plan %+v: want per-link codecs with an fp16 all-gather", plan)
	}
	for k, id := range plan.Order {
		next := plan.Order[(k+1)%4]
		want := "none"
		if id == "a" || next == "a" {
			want = "fp16"
		}
		if plan.LinkCodecs[k] != want {
			t.Fatalf("plan %+v: edge %s → %s has %s, want %s", plan, id, next, plan.LinkCodecs[k], want)
		}
	}
	cur := gossip.Epoch{Number: 2, Order: plan.Order, Coordinator: "a", Schedule: "ring"}
	if !NewPlanner(cfg).Replan(cur, plan, members) {
		t.Fatal("no replan although the slow links carry half the bytes")
	}
	cur.LinkCodecs, cur.FinalCodec = plan.LinkCodecs, plan.FinalCodec
	if NewPlanner(cfg).Replan(cur, plan, members) {
		t.Fatal("replan of the same layout")
	}

	override := cfg
	override.Codec, override.LinkCodecs = "qsgd:bits=8", "int8"
	plan = NewPlanner(override).Plan(ids, members)
	if plan.FinalCodec != "int8:block=2048" || !slices.Contains(plan.LinkCodecs, "qsgd:bits=8,block=512,norm=l2") {
		t.Fatalf("override: plan %+v", plan)
	}
	for name, c := range map[string]Settings{
		"link_codecs off": func() Settings { c := cfg; c.LinkCodecs = LinkCodecsOff; return c }(),
		"sint8":           func() Settings { c := cfg; c.Codec = "sint8"; return c }(),
		"proportional":    func() Settings { c := cfg; c.Schedule = "proportional"; return c }(),
	} {
		if plan := NewPlanner(c).Plan(ids, members); plan.LinkCodecs != nil || plan.FinalCodec != "" {
			t.Errorf("%s: plan %+v has per-link codecs", name, plan)
		}
	}
	// Links within SlowLink of each other keep the codec everywhere.
	if plan := NewPlanner(cfg).Plan(ids, linkMembers(ids, slowPeer(4, 800, 1000))); plan.LinkCodecs != nil {
		t.Errorf("near-uniform links: plan %+v", plan)
	}

	// Schedule auto: proportional shares beat the plain ring here, and the
	// ring with fp16 on the slow peer's links beats both; without per-link
	// codecs the shares stay.
	auto := defaultSettings()
	plan = NewPlanner(auto).Plan(ids, members)
	if plan.Schedule != "auto" || plan.Shares != nil || plan.FinalCodec != "fp16" {
		t.Errorf("schedule auto: plan %+v, want the ring with per-link codecs", plan)
	}
	auto.LinkCodecs = LinkCodecsOff
	plan = NewPlanner(auto).Plan(ids, members)
	if plan.Schedule != string(allreduce.ScheduleProportional) || len(plan.Shares) != 4 || plan.LinkCodecs != nil {
		t.Errorf("schedule auto, link_codecs off: plan %+v, want proportional shares", plan)
	}
}

// TestEpochSpec checks how a ring epoch shapes the all-reduce configuration.
func TestEpochSpec(t *testing.T) {
	order := []string{"a", "b"}
	// a → b measured at 800 Mbit/s; b → a unknown, so the reverse figure stands in.
	links, _ := LinkMatrix(order, map[string][]gossip.LinkFigure{"a": {{Peer: "b", MbitS: 800, RTTMs: 1}}})
	base := allreduce.Config{Schedule: allreduce.ScheduleAuto}
	s := NewEpochSpec(gossip.Epoch{Number: 1, Order: order, Coordinator: order[0],
		Schedule: "proportional", Shares: []float64{0.25, 0.75}}, "a", base, "none", links)
	if s.Session.Schedule != allreduce.ScheduleProportional || !slices.Equal(s.Session.Shares, []float64{0.25, 0.75}) {
		t.Fatalf("session config %+v", s.Session)
	}
	if s.Session.Bandwidth != 100e6 || s.Rank != 0 || s.Ring.Number != 1 || len(s.Ring.Peers) != 2 || s.Ring.Self != "a" {
		t.Fatalf("spec %+v, want bandwidth 100e6 bytes/s, rank 0", s)
	}
	s = NewEpochSpec(gossip.Epoch{Number: 2, Order: order, Coordinator: order[0], Schedule: "bogus"}, "a", base, "none", links)
	if s.Session.Schedule != base.Schedule || s.Session.Shares != nil || len(s.Notes) != 1 {
		t.Fatalf("unknown epoch schedule: spec %+v", s)
	}
	s = NewEpochSpec(gossip.Epoch{Number: 2, Order: order, Coordinator: order[0]}, "b", base, "none", links)
	if s.Session.Schedule != base.Schedule || s.Rank != 1 {
		t.Fatalf("epoch without a schedule: spec %+v", s)
	}
	if s := NewEpochSpec(gossip.Epoch{Number: 3, Order: order}, "c", base, "none", links); s.Rank != -1 {
		t.Fatalf("non-member rank %d", s.Rank)
	}
	// Per-link codecs are kept only for a codec that has per-link variants.
	ep := gossip.Epoch{Number: 4, Order: order, Coordinator: "a", LinkCodecs: []string{"fp16", "fp16"}, FinalCodec: "fp16"}
	if s := NewEpochSpec(ep, "a", base, "none", links); !slices.Equal(s.LinkEdges, ep.LinkCodecs) || s.FinalCodec != "fp16" {
		t.Fatalf("per-link codecs dropped: %+v", s)
	}
	if s := NewEpochSpec(ep, "a", base, "onebit", links); s.LinkEdges != nil || len(s.Notes) != 1 {
		t.Fatalf("per-link codecs kept for onebit: %+v", s)
	}
}
