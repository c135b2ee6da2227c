package node

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/gossip"
)

// startPair starts two loopback peers, b bootstrapping from a, and waits
// until they are connected.
func startPair(t *testing.T, probing bool) (a, b *Node) {
	t.Helper()
	cfg := testConfig()
	cfg.Probe.Enabled = probing
	a = startNode(t, cfg, nil)
	cfg = testConfig(a.AddrStrings()[0])
	cfg.Probe.Enabled = probing
	b = startNode(t, cfg, nil)
	eventually(t, 5*time.Second, "peers connected", func() error {
		if len(a.Host().Network().ConnsToPeer(b.ID())) == 0 {
			return fmt.Errorf("not connected")
		}
		return nil
	})
	return a, b
}

// TestProbeLoopback probes a loopback link: both figures are positive, and
// the upload adapts towards probeTarget.
func TestProbeLoopback(t *testing.T) {
	a, b := startPair(t, false)
	ctx := context.Background()
	smp, err := probePeer(ctx, a.Host(), b.ID(), probeStartBytes, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	if smp.rtt <= 0 || !(smp.bytesPS > 0) || smp.bytes < probeStartBytes || smp.next < probeMinBytes || smp.next > 4<<20 {
		t.Fatalf("probe figures %+v", smp)
	}
	t.Logf("loopback probe: rtt %v, %.0f Mbit/s (upload %d bytes, next %d), took %v",
		smp.rtt, smp.bytesPS*8/1e6, smp.bytes, smp.next, smp.took)
	// The server is free again: a second probe of the same peer works.
	if _, err := probePeer(ctx, a.Host(), b.ID(), smp.next, 4<<20); err != nil {
		t.Fatalf("second probe: %v", err)
	}
}

// rawProbe opens a probe stream from a to b and writes reqs.
func rawProbe(t *testing.T, a, b *Node, reqs ...[]byte) io.ReadWriteCloser {
	t.Helper()
	s, err := a.Host().NewStream(context.Background(), b.ID(), ProtocolProbe)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetDeadline(time.Now().Add(5 * time.Second))
	t.Cleanup(func() { s.Reset() })
	for _, r := range reqs {
		if _, err := s.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func probeReq(version, op byte, n uint32) []byte {
	b := []byte{version, op, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(b[2:], n)
	return b
}

// TestProbeServerRejects checks that the server resets streams that break the
// protocol, without reading (or allocating) what they announce.
func TestProbeServerRejects(t *testing.T) {
	a, b := startPair(t, false)
	tooMany := make([]byte, 0, (probeMaxRequests+1)*probeHeaderLen)
	for range probeMaxRequests + 1 {
		tooMany = append(tooMany, probeReq(probeVersion, probeOpPing, 0)...)
	}
	for _, tt := range []struct {
		name string
		req  []byte
	}{
		{"oversized upload", probeReq(probeVersion, probeOpUpload, MaxProbeBytes+1)},
		{"huge upload", probeReq(probeVersion, probeOpUpload, 1<<32-1)},
		{"empty upload", probeReq(probeVersion, probeOpUpload, 0)},
		{"future version", probeReq(probeVersion+1, probeOpPing, 0)},
		{"unknown op", probeReq(probeVersion, 9, 0)},
		{"ping with a length", probeReq(probeVersion, probeOpPing, 4)},
		{"too many requests", tooMany},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := rawProbe(t, a, b, tt.req)
			// Every valid request before the bad one is answered; then the stream is reset.
			_, err := io.ReadAll(s)
			if err == nil {
				t.Fatal("stream ended cleanly; want a reset")
			}
		})
	}
	// One probe stream per peer at a time.
	first := rawProbe(t, a, b, probeReq(probeVersion, probeOpPing, 0))
	var one [1]byte
	if _, err := io.ReadFull(first, one[:]); err != nil {
		t.Fatalf("first stream's ping: %v", err)
	}
	second := rawProbe(t, a, b, probeReq(probeVersion, probeOpPing, 0))
	if _, err := io.ReadFull(second, one[:]); err == nil {
		t.Fatal("a second concurrent probe stream from the same peer was served")
	}
	// The first stream is still served, and ends cleanly when the client closes it.
	if _, err := first.Write(probeReq(probeVersion, probeOpPing, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(first, one[:]); err != nil {
		t.Fatalf("first stream after the refused one: %v", err)
	}
	first.(interface{ CloseWrite() error }).CloseWrite()
	if rest, err := io.ReadAll(first); err != nil || len(rest) != 0 {
		t.Fatalf("clean end: %d bytes, %v", len(rest), err)
	}
}

// TestProbeBackground checks the background loop: each peer measures the
// other, and the figures reach the other's view through heartbeats and /status.
func TestProbeBackground(t *testing.T) {
	a, b := startPair(t, true)
	eventually(t, 10*time.Second, "b's link measured by a and gossiped", func() error {
		links := a.Links()
		if len(links) != 1 || links[0].Peer != b.ID().String() || !(links[0].MbitS > 0) || !(links[0].RTTMs > 0) {
			return fmt.Errorf("a's links %+v", links)
		}
		members, _ := b.Gossip().Snapshot()
		for _, m := range members {
			if m.PeerID == a.ID().String() && len(m.Links) == 1 && m.Links[0].Peer == b.ID().String() {
				return nil
			}
		}
		return fmt.Errorf("b has not heard a's figures")
	})
	st := a.Status()
	if len(st.Links) != 1 || st.Links[0].Peer != b.ID().String() || !(st.Links[0].MbitS > 0) {
		t.Fatalf("/status links %+v", st.Links)
	}
	m := b.LinkMatrix([]string{a.ID().String(), b.ID().String()})
	if !(m[0][1] > 0) || !(m[1][0] > 0) {
		t.Fatalf("b's matrix %v: want both directions known (b's own or a's figure)", m)
	}
	l := a.Links()[0]
	t.Logf("background loopback figures: %.1f Mbit/s, rtt %.3f ms", l.MbitS, l.RTTMs)
}

// TestProberSchedule checks the pick/record bookkeeping with a fixed clock:
// first probes within the jitter, then once per interval, node-wide spacing
// by the duty cycle, and forgetting peers that left.
func TestProberSchedule(t *testing.T) {
	cfg := DefaultConfig().Probe
	p := &prober{cfg: cfg, log: zap.NewNop(), links: map[peer.ID]*linkState{}, serving: map[peer.ID]bool{}}
	x, y := peer.ID("x"), peer.ID("y")
	now := time.Unix(1000, 0)
	if id, _, wait := p.pick(now, []peer.ID{x, y}); id != "" && wait != 0 {
		t.Fatalf("pick %q wait %v", id, wait)
	}
	later := now.Add(probeFirstJitter)
	id, size, _ := p.pick(later, []peer.ID{x, y})
	if id == "" || size != probeStartBytes {
		t.Fatalf("no first probe once the jitter passed: %q %d", id, size)
	}
	other := x
	if id == x {
		other = y
	}
	took := 100 * time.Millisecond
	p.record(id, probeSample{rtt: time.Millisecond, bytesPS: 1e8, bytes: size, next: 1 << 20}, nil, later, later.Add(took))
	// The other peer's first probe is held back by the warm-up duty only...
	warm := later.Add(time.Duration(float64(took) / probeWarmupDuty))
	if got, _, wait := p.pick(warm.Add(-time.Millisecond), []peer.ID{x, y}); got != "" || wait != time.Millisecond {
		t.Fatalf("picked %q (wait %v) during the warm-up spacing", got, wait)
	}
	if got, _, _ := p.pick(warm, []peer.ID{x, y}); got != other {
		t.Fatalf("picked %q, want the unmeasured %q", got, other)
	}
	p.record(other, probeSample{rtt: time.Millisecond, bytesPS: 2e8, bytes: size, next: 1 << 20}, nil, later.Add(took), later.Add(2*took))
	// ...but measured peers wait for their interval and the duty cycle.
	gap := time.Duration(float64(took) / cfg.DutyCycle)
	if got, _, wait := p.pick(later.Add(2*took+time.Second), []peer.ID{x, y}); got != "" || wait <= 0 {
		t.Fatalf("picked %q (wait %v) a second after measuring it", got, wait)
	}
	due := later.Add(max(cfg.Interval.D(), gap)*11/10 + 2*took + time.Second)
	got, size, _ := p.pick(due, []peer.ID{x, y})
	if got == "" || size != 1<<20 {
		t.Fatalf("nothing due after the interval (got %q size %d)", got, size)
	}
	st := p.statuses()
	if len(st) != 2 || st[0].MbitS != 800 && st[1].MbitS != 800 || st[0].RTTMs != 1 {
		t.Fatalf("statuses %+v", st)
	}
	// A smoothed second figure.
	p.record(got, probeSample{rtt: 3 * time.Millisecond, bytesPS: 3e8, next: 1 << 20}, nil, due, due.Add(took))
	for _, s := range p.statuses() {
		if s.Peer == got.String() && (s.RTTMs != 2) {
			t.Fatalf("smoothed status %+v", s)
		}
	}
	// A failed probe (a timeout) keeps the old figure and holds back neither
	// this peer beyond its interval nor other peers beyond probeMaxIdle.
	fail := due.Add(time.Hour)
	p.record(got, probeSample{}, fmt.Errorf("boom"), fail, fail.Add(probeStreamTimeout))
	if len(p.statuses()) != 2 {
		t.Fatal("a failed probe dropped the figure")
	}
	if next := p.nextAny.Sub(fail.Add(probeStreamTimeout)); next > probeMaxIdle {
		t.Fatalf("a failed probe holds back every probe for %v", next)
	}
	// y leaves: forgotten.
	p.pick(due, []peer.ID{x})
	if st := p.statuses(); len(st) != 1 || st[0].Peer != x.String() {
		t.Fatalf("statuses after y left: %+v", st)
	}
	if f := p.figures(); len(f) != 1 || f[0].Peer != x.String() {
		t.Fatalf("figures %+v", f)
	}
}

func TestRoundFigure(t *testing.T) {
	for _, tt := range []struct{ in, want float64 }{
		{941.23456, 941.2}, {0.0123456, 0.01235}, {12345678, 12350000}, {0, 0}, {-1, 0},
	} {
		if got := roundFigure(tt.in); got != tt.want {
			t.Errorf("roundFigure(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
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
	p := newRingPlanner(DefaultConfig().Allreduce)
	if plan := p.Plan(ids, linkMembers(ids, mbit)); !slices.Equal(plan.Order, ids) || plan.Schedule != "auto" {
		t.Fatalf("plan %+v", plan)
	}
}

func TestPlannerNoFiguresKeepsPeerIDOrder(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	p := newRingPlanner(DefaultConfig().Allreduce)
	plan := p.Plan(ids, linkMembers(ids, make([][]float64, 4)))
	if !slices.Equal(plan.Order, ids) || plan.Schedule != "auto" || plan.Shares != nil {
		t.Fatalf("plan %+v without measurements, want the peer-ID order and auto", plan)
	}
	if p.Replan(gossip.Epoch{Number: 1, Order: ids, Coordinator: "a"}, plan, linkMembers(ids, make([][]float64, 4))) {
		t.Fatal("replan without measurements")
	}
}

// TestPlannerRing checks that the planner orders the ring as
// allreduce.RingOrder does over the measured matrix, and re-plans only from
// a complete matrix.
func TestPlannerRing(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	// Fast ring a → c → b → d → a (1000 Mbit/s), everything else 100 Mbit/s.
	mbit := fastRing(4, []int{0, 2, 1, 3}, 1000, 100)
	members := linkMembers(ids, mbit)
	p := newRingPlanner(DefaultConfig().Allreduce)
	plan := p.Plan(ids, members)
	want := orderOf(ids, allreduce.RingOrder(mbitMatrix(mbit)))
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
	cfg := DefaultConfig().Allreduce
	cfg.LinkCodecs = LinkCodecsOff // else fp16 on b's links beats the shares (TestPlannerLinkCodecs)
	p := newRingPlanner(cfg)
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
	if plan := newRingPlanner(cfg).Plan(ids, members); plan.Schedule != "ring" || plan.Shares != nil {
		t.Fatalf("plan %+v with allreduce.schedule = ring", plan)
	}
	cfg.Schedule = "proportional"
	if plan := newRingPlanner(cfg).Plan(ids, members); plan.Schedule != "proportional" || len(plan.Shares) != 4 {
		t.Fatalf("plan %+v with allreduce.schedule = proportional", plan)
	}
}

// TestEpochSession checks how a ring epoch shapes the all-reduce configuration.
func TestEpochSession(t *testing.T) {
	a, b := startPair(t, false)
	order := []string{a.ID().String(), b.ID().String()}
	a.probe.set(LinkStatus{Peer: order[1], MbitS: 800, RTTMs: 1, MeasuredAt: time.Now()})
	base := a.cfg.Allreduce.Session(nil)
	cfg := a.epochSession(base, gossip.Epoch{Number: 1, Order: order, Coordinator: order[0],
		Schedule: "proportional", Shares: []float64{0.25, 0.75}})
	if cfg.Schedule != allreduce.ScheduleProportional || !slices.Equal(cfg.Shares, []float64{0.25, 0.75}) {
		t.Fatalf("session config %+v", cfg)
	}
	// b → a is not measured: the reverse figure stands in.
	if cfg.Bandwidth != 100e6 {
		t.Fatalf("bandwidth %v, want 100e6 bytes/s", cfg.Bandwidth)
	}
	cfg = a.epochSession(base, gossip.Epoch{Number: 2, Order: order, Coordinator: order[0], Schedule: "bogus"})
	if cfg.Schedule != base.Schedule || cfg.Shares != nil {
		t.Fatalf("unknown epoch schedule: config %+v", cfg)
	}
	cfg = b.epochSession(base, gossip.Epoch{Number: 2, Order: order, Coordinator: order[0]})
	if cfg.Schedule != base.Schedule {
		t.Fatalf("epoch without a schedule: config %+v", cfg)
	}
}

// TestRingFollowsMeasuredLinks runs four peers whose links are injected (a
// fast ring in an order other than the peer IDs'): the coordinator re-plans
// and every peer adopts the order allreduce.RingOrder picks for the matrix.
func TestRingFollowsMeasuredLinks(t *testing.T) {
	cfg := testConfig()
	cfg.Probe.Enabled = false
	first := startNode(t, cfg, nil)
	nodes := []*Node{first}
	for range 3 {
		cfg := testConfig(first.AddrStrings()[0])
		cfg.Probe.Enabled = false
		nodes = append(nodes, startNode(t, cfg, nil))
	}
	eventually(t, 10*time.Second, "one epoch of four", func() error { return agreeOn(nodes, ids(nodes)) })
	slices.SortFunc(nodes, func(x, y *Node) int { return strings.Compare(x.ID().String(), y.ID().String()) })
	var sorted []string
	for _, n := range nodes {
		sorted = append(sorted, n.ID().String())
	}
	// Fast ring through sorted peers 0 → 2 → 1 → 3; the peer-ID order has
	// only slow edges between 0–1 and 2–3.
	mbit := fastRing(4, []int{0, 2, 1, 3}, 1000, 100)
	want := orderOf(sorted, allreduce.RingOrder(mbitMatrix(mbit)))
	now := time.Now()
	for i, n := range nodes {
		for j, v := range mbit[i] {
			if j != i {
				n.probe.set(LinkStatus{Peer: sorted[j], MbitS: v, RTTMs: 0.2, MeasuredAt: now})
			}
		}
		n.Gossip().Beat()
	}
	eventually(t, 10*time.Second, "ring re-planned for the links", func() error {
		if err := agreeOn(nodes, ids(nodes)); err != nil {
			return err
		}
		_, ep := nodes[0].Gossip().Snapshot()
		if !slices.Equal(ep.Order, want) {
			return fmt.Errorf("epoch %d order %v, want %v", ep.Number, ep.Order, want)
		}
		return nil
	})
	_, ep := nodes[0].Gossip().Snapshot()
	if ep.Schedule != "auto" || ep.Shares != nil {
		t.Fatalf("epoch %+v: want schedule auto without shares on a uniform-NIC cluster", ep)
	}
	if m := nodes[1].LinkMatrix(ep.Order); ringBandwidth(m) != 1000e6/8 {
		t.Fatalf("slowest edge of the adopted ring %v bytes/s, want 125e6 (matrix %v)", ringBandwidth(m), m)
	}
	st := nodes[2].Status()
	if len(st.Links) != 3 || !slices.Equal(st.Ring.Order, want) {
		t.Fatalf("/status links %+v ring %+v", st.Links, st.Ring)
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

func mbitMatrix(mbit [][]float64) allreduce.Matrix {
	m := make(allreduce.Matrix, len(mbit))
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
	cfg := DefaultConfig().Allreduce
	cfg.Schedule = "ring"
	plan := newRingPlanner(cfg).Plan(ids, members)
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
	if !newRingPlanner(cfg).Replan(cur, plan, members) {
		t.Fatal("no replan although the slow links carry half the bytes")
	}
	cur.LinkCodecs, cur.FinalCodec = plan.LinkCodecs, plan.FinalCodec
	if newRingPlanner(cfg).Replan(cur, plan, members) {
		t.Fatal("replan of the same layout")
	}

	override := cfg
	override.Codec, override.LinkCodecs = "qsgd:bits=8", "int8"
	plan = newRingPlanner(override).Plan(ids, members)
	if plan.FinalCodec != "int8:bucket=2048" || !slices.Contains(plan.LinkCodecs, "qsgd:bits=8,bucket=512,norm=l2") {
		t.Fatalf("override: plan %+v", plan)
	}
	for name, c := range map[string]AllreduceConfig{
		"link_codecs off": func() AllreduceConfig { c := cfg; c.LinkCodecs = LinkCodecsOff; return c }(),
		"sint8":           func() AllreduceConfig { c := cfg; c.Codec = "sint8"; return c }(),
		"proportional":    func() AllreduceConfig { c := cfg; c.Schedule = "proportional"; return c }(),
	} {
		if plan := newRingPlanner(c).Plan(ids, members); plan.LinkCodecs != nil || plan.FinalCodec != "" {
			t.Errorf("%s: plan %+v has per-link codecs", name, plan)
		}
	}
	// Links within SlowLink of each other keep the codec everywhere.
	if plan := newRingPlanner(cfg).Plan(ids, linkMembers(ids, slowPeer(4, 800, 1000))); plan.LinkCodecs != nil {
		t.Errorf("near-uniform links: plan %+v", plan)
	}

	// Schedule auto: proportional shares beat the plain ring here, and the
	// ring with fp16 on the slow peer's links beats both; without per-link
	// codecs the shares stay.
	auto := DefaultConfig().Allreduce
	plan = newRingPlanner(auto).Plan(ids, members)
	if plan.Schedule != "auto" || plan.Shares != nil || plan.FinalCodec != "fp16" {
		t.Errorf("schedule auto: plan %+v, want the ring with per-link codecs", plan)
	}
	auto.LinkCodecs = LinkCodecsOff
	plan = newRingPlanner(auto).Plan(ids, members)
	if plan.Schedule != string(allreduce.ScheduleProportional) || len(plan.Shares) != 4 || plan.LinkCodecs != nil {
		t.Errorf("schedule auto, link_codecs off: plan %+v, want proportional shares", plan)
	}
}
