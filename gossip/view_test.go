package gossip

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

var testTiming = Timing{SuspectAfter: 2 * time.Second, FailAfter: 5 * time.Second, ForgetAfter: time.Minute}

func hb(id string, seq uint64) Heartbeat {
	return Heartbeat{PeerID: id, Name: id, Version: "test", Seq: seq}
}

// cluster is a set of views exchanging messages through a perfect in-memory
// network, the way a test drives etcd raft's pure core.
type cluster struct {
	views map[string]*View
	now   time.Time
	seq   uint64
	down  map[string]bool
	// mute are members that heartbeat but never propose an epoch.
	mute map[string]bool
}

func newCluster(ids ...string) *cluster {
	c := &cluster{views: map[string]*View{}, now: t0, down: map[string]bool{}, mute: map[string]bool{}}
	for _, id := range ids {
		c.views[id] = NewView(hb(id, 0), testTiming, t0)
	}
	return c
}

// commit is agree followed by every view of c committing the epoch (a
// step completed in it).
func (c *cluster) commit(t *testing.T, order []string) Epoch {
	t.Helper()
	e := c.agree(t, order)
	for _, v := range c.views {
		v.Commit(e.Number)
	}
	return e
}

// partition splits c's views into two clusters that hear only their own
// side (their clocks start at c's), and runs both sides apart for four
// rounds of 2 s.
func (c *cluster) partition(a, b []string) (*cluster, *cluster) {
	side := func(ids []string) *cluster {
		s := &cluster{views: map[string]*View{}, now: c.now, seq: c.seq, down: map[string]bool{}}
		for _, id := range ids {
			s.views[id] = c.views[id]
		}
		return s
	}
	sa, sb := side(a), side(b)
	for range 4 {
		sa.round(2 * time.Second)
		sb.round(2 * time.Second)
	}
	return sa, sb
}

// round delivers one heartbeat from every live view to every other, then lets
// coordinators propose, repeating deliveries until no proposal is left.
func (c *cluster) round(d time.Duration) {
	c.now = c.now.Add(d)
	c.seq++
	for id, v := range c.views {
		if c.down[id] {
			continue
		}
		v.Tick(c.now)
		h := hb(id, c.seq)
		h.Epoch = v.Epoch()
		h.Excluded = v.OwnExclusions()
		for other, w := range c.views {
			if other != id && !c.down[other] {
				w.Heartbeat(h, c.now)
			}
		}
	}
	c.settle()
}

func (c *cluster) settle() {
	for i := 0; i < 10; i++ {
		proposed := false
		for id, v := range c.views {
			if c.down[id] || c.mute[id] {
				continue
			}
			if e, ok := v.Proposal(0); ok {
				proposed = true
				for other, w := range c.views {
					if !c.down[other] {
						w.Offer(e, e.Coordinator, c.now)
					}
				}
				_ = id
			}
		}
		if !proposed {
			return
		}
	}
}

func (c *cluster) agree(t *testing.T, want []string) Epoch {
	t.Helper()
	var first Epoch
	for id, v := range c.views {
		if c.down[id] {
			continue
		}
		e := v.Epoch()
		if !slices.Equal(e.Order, want) {
			t.Fatalf("%s has epoch %d order %v, want %v", id, e.Number, e.Order, want)
		}
		if first.Number == 0 {
			first = e
		} else if !first.Equal(e) {
			t.Fatalf("views disagree: %+v vs %+v", first, e)
		}
	}
	return first
}

func TestViewFormsOneEpoch(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.round(time.Second)
	e := c.agree(t, []string{"a", "b", "c"})
	if e.Coordinator != "a" {
		t.Fatalf("coordinator %s, want the lowest peer ID a", e.Coordinator)
	}
	// Stable membership: no new epochs.
	for i := 0; i < 5; i++ {
		c.round(time.Second)
	}
	if got := c.agree(t, []string{"a", "b", "c"}); got.Number != e.Number {
		t.Fatalf("epoch moved from %d to %d without a membership change", e.Number, got.Number)
	}
}

func TestViewFailureDetection(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.round(time.Second)
	before := c.agree(t, []string{"a", "b", "c"}).Number
	c.down["b"] = true
	// Suspect after 2 s of silence, still in the ring.
	c.round(2 * time.Second)
	if st := stateOf(c.views["a"], "b"); st != Suspect {
		t.Fatalf("b is %v after 2s of silence, want suspect", st)
	}
	c.agree(t, []string{"a", "b", "c"})
	c.round(3 * time.Second)
	if st := stateOf(c.views["a"], "b"); st != Dead {
		t.Fatalf("b is %v after 5s of silence, want dead", st)
	}
	e := c.agree(t, []string{"a", "c"})
	if e.Number <= before {
		t.Fatalf("epoch number %d not above %d", e.Number, before)
	}
	// b is forgotten after ForgetAfter.
	c.round(time.Minute)
	if st := stateOf(c.views["a"], "b"); st != -1 {
		t.Fatalf("b still known as %v after ForgetAfter", st)
	}
}

func TestViewCoordinatorDies(t *testing.T) {
	c := newCluster("a", "b", "c", "d")
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c", "d"})
	c.down["a"] = true
	c.round(5 * time.Second)
	e := c.agree(t, []string{"b", "c", "d"})
	if e.Coordinator != "b" {
		t.Fatalf("coordinator %s, want b to take over", e.Coordinator)
	}
}

func TestViewLeaveAndLateHeartbeat(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c"})
	c.down["a"] = true
	c.seq++ // the departure comes after a's last heartbeat
	for _, id := range []string{"b", "c"} {
		c.views[id].Leave(Leave{PeerID: "a", Seq: c.seq}, c.now)
	}
	// An old heartbeat of a's arriving after its departure is ignored.
	c.views["b"].Heartbeat(hb("a", c.seq-1), c.now)
	c.settle()
	e := c.agree(t, []string{"b", "c"})
	if e.Coordinator != "b" {
		t.Fatalf("coordinator %s, want b", e.Coordinator)
	}
	if st := stateOf(c.views["b"], "a"); st != Left {
		t.Fatalf("a is %v, want left", st)
	}
	// a restarts (a later sequence number): it is back.
	delete(c.down, "a")
	c.views["a"] = NewView(hb("a", 0), testTiming, c.now)
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c"})
}

func TestViewJoinerAdoptsAndNoProposalWar(t *testing.T) {
	c := newCluster("b", "c")
	c.round(time.Second)
	first := c.agree(t, []string{"b", "c"})
	// "a" joins with the lowest ID; "c" hears about a only through b's epoch.
	c.views["a"] = NewView(hb("a", 0), testTiming, c.now)
	c.views["b"].Heartbeat(hb("a", 1), c.now)
	e, ok := c.views["b"].Proposal(0)
	if ok {
		t.Fatalf("b proposed %+v although a has a lower ID", e)
	}
	// a learns the current epoch from b's heartbeat, becomes coordinator, proposes.
	hbB := hb("b", 100)
	hbB.Epoch = c.views["b"].Epoch()
	c.views["a"].Heartbeat(hbB, c.now)
	e, ok = c.views["a"].Proposal(7)
	if !ok || e.Number != first.Number+1 || e.StartStep != 7 {
		t.Fatalf("a's proposal %+v ok=%v, want epoch %d from step 7", e, ok, first.Number+1)
	}
	// c has never heard of a; it adopts the epoch and must not counter-propose.
	c.views["c"].Offer(e, e.Coordinator, c.now)
	if e2, ok := c.views["c"].Proposal(0); ok {
		t.Fatalf("c counter-proposed %+v", e2)
	}
	c.views["b"].Offer(e, e.Coordinator, c.now)
	c.views["a"].Offer(e, e.Coordinator, c.now)
	// a follows only itself, so it did not adopt b's epoch and had not
	// heard of c: one more epoch brings c in, and then the ring is stable.
	c.round(time.Second)
	settled := c.agree(t, []string{"a", "b", "c"})
	if settled.Number > e.Number+1 {
		t.Fatalf("epoch moved on to %d, want at most %d", settled.Number, e.Number+1)
	}
	for range 3 {
		c.round(time.Second)
	}
	if got := c.agree(t, []string{"a", "b", "c"}); got.Number != settled.Number {
		t.Fatalf("epoch moved on to %d after settling at %d", got.Number, settled.Number)
	}
}

func TestOfferPrefersHigherThenLowerProposer(t *testing.T) {
	v := NewView(hb("x", 0), testTiming, t0)
	e5b := Epoch{Number: 5, Order: []string{"b", "x"}, Coordinator: "b"}
	e5a := Epoch{Number: 5, Order: []string{"a", "x"}, Coordinator: "a"}
	e4 := Epoch{Number: 4, Order: []string{"a", "x"}, Coordinator: "a"}
	v.Offer(e5b, e5b.Coordinator, t0)
	v.Offer(e4, e4.Coordinator, t0)
	if v.Epoch().Coordinator != "b" {
		t.Fatal("an older epoch replaced a newer one")
	}
	v.Offer(e5a, e5a.Coordinator, t0)
	if v.Epoch().Coordinator != "a" {
		t.Fatal("tie on number not broken by the lower proposer")
	}
	v.Offer(e5b, e5b.Coordinator, t0)
	if v.Epoch().Coordinator != "a" {
		t.Fatal("tie broken towards the higher proposer")
	}
	bad := Epoch{Number: 9, Order: []string{"a", "a"}, Coordinator: "a"}
	v.Offer(bad, bad.Coordinator, t0)
	if v.Epoch().Number != 5 {
		t.Fatal("adopted an invalid epoch")
	}
}

func stateOf(v *View, id string) State {
	for _, m := range v.Members() {
		if m.PeerID == id {
			return m.State
		}
	}
	return -1
}

func TestViewWantEpochForcesNewEpoch(t *testing.T) {
	c := newCluster("a", "b")
	c.round(time.Second)
	e := c.agree(t, []string{"a", "b"})
	// b's round failed: it asks for an epoch above the current one.
	h := hb("b", 1000)
	h.Epoch = e
	h.WantEpoch = e.Number
	c.views["a"].Heartbeat(h, c.now)
	next, ok := c.views["a"].Proposal(3)
	if !ok || next.Number != e.Number+1 || !slices.Equal(next.Order, e.Order) {
		t.Fatalf("proposal %+v ok=%v, want epoch %d with the same members", next, ok, e.Number+1)
	}
	c.views["a"].Offer(next, next.Coordinator, c.now)
	if _, ok := c.views["a"].Proposal(3); ok {
		t.Fatal("the satisfied request keeps forcing epochs")
	}
}

// fakePlanner orders members by descending peer ID (any order other than the
// default will do) with a fixed schedule and shares; its Replan answer is set
// by the test.
type fakePlanner struct {
	schedule string
	shares   func(n int) []float64
	// drop, when set, leaves this member out of the plan (an invalid plan).
	drop    string
	links   bool
	replan  bool
	plans   int
	replans int
}

func (p *fakePlanner) Plan(live []string, members []Member) EpochPlan {
	p.plans++
	var order []string
	for _, id := range slices.Backward(live) {
		if id != p.drop {
			order = append(order, id)
		}
	}
	var sh []float64
	if p.shares != nil {
		sh = p.shares(len(order))
	}
	plan := EpochPlan{Order: order, Schedule: p.schedule, Shares: sh}
	if p.links {
		for range order {
			plan.LinkCodecs = append(plan.LinkCodecs, "fp16")
		}
		plan.FinalCodec = "fp16"
	}
	return plan
}

func (p *fakePlanner) Replan(cur Epoch, plan EpochPlan, members []Member) bool {
	p.replans++
	return p.replan
}

func equalShares(n int) []float64 {
	sh := make([]float64, n)
	for i := range sh {
		sh[i] = 1 / float64(n)
	}
	sh[n-1] = 1 - float64(n-1)/float64(n)
	return sh
}

func TestViewPlannerOrdersProposals(t *testing.T) {
	c := newCluster("a", "b", "c")
	p := &fakePlanner{schedule: "proportional", shares: equalShares}
	c.views["a"].SetPlanner(p, 0)
	c.round(time.Second)
	e := c.agree(t, []string{"c", "b", "a"})
	if e.Coordinator != "a" || e.Schedule != "proportional" || len(e.Shares) != 3 {
		t.Fatalf("epoch %+v: want coordinator a with the planner's schedule and 3 shares", e)
	}
	// Stable membership and no replan interval: no new epochs.
	for i := 0; i < 3; i++ {
		c.round(time.Second)
	}
	if got := c.agree(t, []string{"c", "b", "a"}); got.Number != e.Number {
		t.Fatalf("epoch moved from %d to %d without a membership change", e.Number, got.Number)
	}
	// Membership change: the planner lays out the new members too.
	c.down["c"] = true
	c.round(6 * time.Second)
	c.agree(t, []string{"b", "a"})
}

func TestViewInvalidPlanFallsBackToPeerIDOrder(t *testing.T) {
	for _, tt := range []struct {
		name string
		p    *fakePlanner
	}{
		{"member missing", &fakePlanner{drop: "b"}},
		{"shares of another length", &fakePlanner{shares: func(int) []float64 { return []float64{1} }}},
		{"bad schedule name", &fakePlanner{schedule: "Ring!"}},
		{"shares not summing to 1", &fakePlanner{shares: func(n int) []float64 { return make([]float64, n) }}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster("a", "b", "c")
			c.views["a"].SetPlanner(tt.p, 0)
			c.round(time.Second)
			e := c.agree(t, []string{"a", "b", "c"})
			if e.Schedule != "" || e.Shares != nil || tt.p.plans == 0 {
				t.Fatalf("epoch %+v after %d plans: want the plain peer-ID order", e, tt.p.plans)
			}
		})
	}
}

func TestViewReplan(t *testing.T) {
	c := newCluster("a", "b", "c")
	p := &fakePlanner{}
	v := c.views["a"]
	c.round(time.Second)
	first := c.agree(t, []string{"a", "b", "c"})
	// No planner: never.
	if e, ok := v.Replan(0, c.now); ok {
		t.Fatalf("replanned %+v without a planner", e)
	}
	v.SetPlanner(p, time.Minute)
	// The planner finds nothing worth an epoch.
	if e, ok := v.Replan(0, c.now); ok || p.replans != 1 {
		t.Fatalf("replanned %+v (ok=%v) although the planner declined (asked %d times)", e, ok, p.replans)
	}
	// Only the coordinator replans.
	c.views["b"].SetPlanner(&fakePlanner{replan: true}, time.Minute)
	if e, ok := c.views["b"].Replan(0, c.now); ok {
		t.Fatalf("non-coordinator b replanned %+v", e)
	}
	p.replan = true
	e, ok := v.Replan(5, c.now)
	if !ok || e.Number != first.Number+1 || !slices.Equal(e.Order, []string{"c", "b", "a"}) || e.StartStep != 5 {
		t.Fatalf("replan %+v ok=%v: want epoch %d ordered c b a from step 5", e, ok, first.Number+1)
	}
	for _, w := range c.views {
		w.Offer(e, e.Coordinator, c.now)
	}
	c.agree(t, []string{"c", "b", "a"})
	// The adopted layout is what the planner wants: nothing to do, and the
	// planner is not even asked.
	asked := p.replans
	c.now = c.now.Add(2 * time.Minute)
	if _, ok := v.Replan(6, c.now); ok || p.replans != asked {
		t.Fatalf("replanned an identical layout (ok=%v, asked %d more times)", ok, p.replans-asked)
	}
	// A different layout is judged better, but only once per interval.
	p.schedule = "proportional"
	if e, ok := v.Replan(6, c.now); !ok || e.Schedule != "proportional" {
		t.Fatalf("replan %+v ok=%v: want the new schedule", e, ok)
	}
	for _, w := range c.views {
		w.Offer(e, e.Coordinator, c.now)
	}
	// Per-link codecs alone are a different layout too.
	c.now = c.now.Add(time.Minute)
	p.links = true
	if e, ok := v.Replan(6, c.now); !ok || e.FinalCodec != "fp16" || len(e.LinkCodecs) != 3 {
		t.Fatalf("replan %+v ok=%v: want the per-link codecs", e, ok)
	}
	p.schedule = "ring"
	if e, ok := v.Replan(7, c.now.Add(30*time.Second)); ok {
		t.Fatalf("replanned %+v within the interval", e)
	}
	if _, ok := v.Replan(7, c.now.Add(time.Minute)); !ok {
		t.Fatal("no replan once the interval passed")
	}
	// A membership change is Proposal's business, not Replan's.
	c.down["c"] = true
	c.round(6 * time.Second)
	if _, ok := v.Replan(8, c.now.Add(time.Hour)); ok {
		t.Fatal("Replan proposed with a settled membership and an identical plan")
	}
}

// TestOfferRefusesEpochNumbersThatWouldWrap: an epoch numbered near 2^64
// (or far beyond the highest seen) is refused and counted; the numbering
// goes on from the last good epoch. Such an epoch was once adopted, the
// next proposal wrapped to 0 and was rejected, and the cluster stopped.
func TestOfferRefusesEpochNumbersThatWouldWrap(t *testing.T) {
	c := newCluster("a", "b")
	c.round(time.Second)
	good := c.agree(t, []string{"a", "b"})
	for _, n := range []uint64{^uint64(0), MaxEpochNumber + 1, good.Number + MaxEpochJump + 1} {
		forged := Epoch{Number: n, Order: []string{"a", "b"}, Coordinator: "a"}
		for _, v := range c.views {
			v.Offer(forged, "a", c.now)
		}
	}
	for id, v := range c.views {
		if v.Epoch().Number != good.Number {
			t.Fatalf("%s adopted epoch %d", id, v.Epoch().Number)
		}
		if n, err := v.Rejections(); n != 3 || !errors.Is(err, ErrEpochRejected) {
			t.Fatalf("%s counted %d rejections (%v), want 3", id, n, err)
		}
	}
	// The next epoch follows the good one.
	h := hb("b", 1000)
	h.Epoch, h.WantEpoch = good, good.Number
	c.views["a"].Heartbeat(h, c.now)
	next, ok := c.views["a"].Proposal(0)
	if !ok || next.Number != good.Number+1 {
		t.Fatalf("proposal %+v ok=%v, want epoch %d", next, ok, good.Number+1)
	}
	// A view that has seen the limit proposes nothing rather than wrap.
	v := NewView(hb("z", 0), testTiming, t0)
	v.epoch = Epoch{Number: MaxEpochNumber, Order: []string{"z"}, Coordinator: "z"}
	v.maxEpoch = MaxEpochNumber
	v.members["z"].WantEpoch = MaxEpochNumber
	if e, ok := v.Proposal(0); ok {
		t.Fatalf("proposed %+v past the limit", e)
	}
}

// TestForgedHintAtStartDoesNotLiftNumbering: a peer that has seen no epoch
// yet refuses a forged number far above 0 in another member's heartbeat,
// so its first proposal stays within reach of the ring's (the chaos
// suite's forged-epoch case once stalled a cluster whose coordinator heard
// 2^40 first and proposed 2^40+1, which every other peer refused).
func TestForgedHintAtStartDoesNotLiftNumbering(t *testing.T) {
	v := NewView(hb("a", 0), testTiming, t0)
	h := hb("z", 1)
	h.Epoch = Epoch{Number: 1 << 40, Order: []string{"z"}, Coordinator: "z"}
	v.Heartbeat(h, t0)
	if n, _ := v.Rejections(); n != 1 {
		t.Fatalf("%d rejections, want the forged hint refused", n)
	}
	if e, ok := v.Proposal(0); !ok || e.Number != 1 {
		t.Fatalf("first proposal %+v (ok %v), want epoch 1", e, ok)
	}
}

// TestOfferFollowsOnlyItsCoordinator: an epoch is adopted only from the
// peer that proposed it, and only if that peer is this view's coordinator
// (or a lower ID it has not heard of yet); a member's copy of someone
// else's epoch is a hint of the numbering only.
func TestOfferFollowsOnlyItsCoordinator(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.round(time.Second)
	good := c.agree(t, []string{"a", "b", "c"})
	v := c.views["c"]
	// b is not c's coordinator (a is).
	byB := Epoch{Number: good.Number + 1, Order: []string{"b", "c"}, Coordinator: "b"}
	v.Offer(byB, "b", c.now)
	// b forwards an epoch that names a as coordinator.
	forwarded := Epoch{Number: good.Number + 2, Order: []string{"a", "c"}, Coordinator: "a"}
	v.Offer(forwarded, "b", c.now)
	if v.Epoch().Number != good.Number {
		t.Fatalf("c adopted epoch %d (coordinator %s)", v.Epoch().Number, v.Epoch().Coordinator)
	}
	if n, _ := v.Rejections(); n != 1 {
		t.Fatalf("%d rejections, want 1 (b's proposal; the forwarded copy is only a hint)", n)
	}
	// A dead member cannot propose either.
	c.down["a"] = true
	c.round(6 * time.Second)
	if st := stateOf(v, "a"); st != Dead {
		t.Fatalf("a is %v", st)
	}
	before := v.Epoch()
	v.Offer(Epoch{Number: before.Number + 1, Order: []string{"a", "c"}, Coordinator: "a"}, "a", c.now)
	if v.Epoch().Number != before.Number {
		t.Fatal("adopted an epoch from a member this view holds dead")
	}
}

// TestProposalNeedsQuorum: in a 2+1 partition the isolated peer proposes
// no ring of its own and says why; the majority goes on, and on healing
// the isolated peer adopts the majority's lineage. (The isolated peer once
// formed a ring of one and trained alone.)
func TestProposalNeedsQuorum(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.round(time.Second)
	first := c.agree(t, []string{"a", "b", "c"})
	// Partition {a, b} | {c}: simulate by running the two sides apart.
	majority, _ := c.partition([]string{"a", "b"}, []string{"c"})
	maj := majority.agree(t, []string{"a", "b"})
	if got := c.views["c"].Epoch(); got.Number != first.Number {
		t.Fatalf("the isolated peer moved to epoch %d %v", got.Number, got.Order)
	}
	if w := c.views["c"].Waiting(); !strings.Contains(w, "no quorum: 1 of the 3 members") {
		t.Fatalf("Waiting() = %q", w)
	}
	// Heal: everyone hears everyone again.
	c.now, c.seq = majority.now, majority.seq
	c.round(time.Second)
	c.round(time.Second)
	healed := c.agree(t, []string{"a", "b", "c"})
	if healed.Number <= maj.Number || healed.Coordinator != "a" {
		t.Fatalf("healed epoch %+v, want one after the majority's %d", healed, maj.Number)
	}
}

// TestQuorumIgnoresCleanDepartures: members that left cleanly do not count
// against the quorum, so a cluster can shrink to one peer by departures.
func TestQuorumIgnoresCleanDepartures(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c"})
	for _, gone := range []string{"b", "c"} {
		c.down[gone] = true
		c.seq++
		c.views["a"].Leave(Leave{PeerID: gone, Seq: c.seq}, c.now)
		c.settle()
	}
	if e := c.views["a"].Epoch(); !slices.Equal(e.Order, []string{"a"}) {
		t.Fatalf("epoch %+v, want a alone; waiting: %s", e, c.views["a"].Waiting())
	}
}

// TestObserversStayOutOfRings: a member that announces itself an observer
// (a peer that does not train) is never put in a ring and never
// coordinates, even with the lowest peer ID. (A plain join once entered the
// ring and froze training.)
func TestObserversStayOutOfRings(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.views["a"].members["a"].Observer = true
	for range 2 {
		c.now = c.now.Add(time.Second)
		c.seq++
		for id, v := range c.views {
			v.Tick(c.now)
			h := hb(id, c.seq)
			h.Observer = id == "a"
			h.Epoch = v.Epoch()
			for other, w := range c.views {
				if other != id {
					w.Heartbeat(h, c.now)
				}
			}
		}
		c.settle()
	}
	e := c.agree(t, []string{"b", "c"})
	if e.Coordinator != "b" {
		t.Fatalf("coordinator %s, want b", e.Coordinator)
	}
}

// TestLeaveOfUnknownPeersIsNotRecorded: departures of peers the view never
// knew leave no trace (each once added an entry that lived until forgotten,
// so fresh identities could grow the view without bound).
func TestLeaveOfUnknownPeersIsNotRecorded(t *testing.T) {
	v := NewView(hb("a", 0), testTiming, t0)
	for i := range 1000 {
		v.Leave(Leave{PeerID: fmt.Sprintf("stranger-%d", i), Seq: 1}, t0)
	}
	if len(v.leftSeq) != 0 || len(v.members) != 1 {
		t.Fatalf("%d departures and %d members recorded, want 0 and 1", len(v.leftSeq), len(v.members))
	}
}

// TestExcludedMemberSitsOutItsBackOff: a member every view excludes (the
// trainers blamed it for consecutive failed steps) leaves the ring and the
// coordinator's seat for its back-off, its proposals are refused, it comes
// back when the back-off ends, and a second exclusion lasts twice as long.
// (A member that heartbeats but sends no frames once failed every step.)
func TestExcludedMemberSitsOutItsBackOff(t *testing.T) {
	c := newCluster("a", "b", "c", "d")
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c", "d"})
	for _, id := range []string{"b", "c", "d"} {
		if d := c.views[id].Exclude("a", "frame timeouts", c.now); d != DefaultExcludeFor {
			t.Fatalf("first back-off %s, want %s", d, DefaultExcludeFor)
		}
	}
	if d := c.views["b"].Exclude("b", "self", c.now); d != 0 {
		t.Fatal("a view excluded its own peer")
	}
	c.round(time.Second)
	// a still sees itself as coordinator; the others follow b.
	delete(c.views, "a")
	c.agree(t, []string{"b", "c", "d"})
	v := c.views["c"]
	before := v.Epoch()
	v.Offer(Epoch{Number: before.Number + 1, Order: []string{"a", "b", "c", "d"}, Coordinator: "a"}, "a", c.now)
	if v.Epoch().Number != before.Number {
		t.Fatal("adopted an epoch proposed by an excluded member")
	}
	if until, why := v.Excluded("a"); until.IsZero() || why != "frame timeouts" {
		t.Fatalf("Excluded(a) = %v, %q", until, why)
	}
	// The back-off ends: a is back in the next ring.
	c.views["a"] = NewView(hb("a", c.seq), testTiming, c.now)
	c.round(DefaultExcludeFor)
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c", "d"})
	if d := c.views["b"].Exclude("a", "again", c.now); d != 2*DefaultExcludeFor {
		t.Fatalf("second back-off %s, want %s", d, 2*DefaultExcludeFor)
	}
	for range 10 {
		c.views["b"].Exclude("a", "again", c.now)
	}
	if until, _ := c.views["b"].Excluded("a"); until.Sub(c.now) != DefaultExcludeFor<<MaxExcludeDoublings {
		t.Fatalf("back-off grew to %s, want the cap %s", until.Sub(c.now), DefaultExcludeFor<<MaxExcludeDoublings)
	}
}

// TestMajorityOverridesOneViewsExclusion: one peer that excluded the
// coordinator the others follow (its blame differed from theirs) adopts
// their epoch once a majority announces it in heartbeats, instead of
// refusing their ring for its whole back-off (the chaos suite's flood case
// once left a peer out of every ring for the rest of the run).
func TestMajorityOverridesOneViewsExclusion(t *testing.T) {
	c := newCluster("a", "b", "c", "d")
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c", "d"})
	d := c.views["d"]
	d.Exclude("a", "frame timeouts", c.now)
	before := d.Epoch()
	next := Epoch{Number: before.Number + 1, Order: []string{"a", "b", "c", "d"}, Coordinator: "a"}
	for _, id := range []string{"a", "b", "c", "d"} {
		c.views[id].Offer(next, "a", c.now)
	}
	if d.Epoch().Number != before.Number {
		t.Fatal("d adopted a proposal of the coordinator it excluded, before any majority")
	}
	c.round(time.Second) // a, b and c announce next in their heartbeats
	c.agree(t, []string{"a", "b", "c", "d"})
	if got := d.Epoch(); !got.Equal(next) {
		t.Fatalf("d is in epoch %d, want the majority's %d", got.Number, next.Number)
	}
	if until, _ := d.Excluded("a"); !until.IsZero() {
		t.Fatal("d's exclusion of the coordinator the majority follows still holds")
	}
}

// TestLoneMemberCannotVouchForItsEpoch: an epoch that only its author
// announces (its order naming itself alone) is not a majority's.
func TestLoneMemberCannotVouchForItsEpoch(t *testing.T) {
	c := newCluster("a", "b", "c", "z")
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c", "z"})
	b := c.views["b"]
	before := b.Epoch()
	forged := Epoch{Number: before.Number + 1, Order: []string{"z"}, Coordinator: "z"}
	h := hb("z", c.seq+1)
	h.Epoch = forged
	b.Heartbeat(h, c.now)
	b.Offer(forged, "z", c.now)
	if b.Epoch().Number != before.Number {
		t.Fatalf("b adopted z's epoch of one: %+v", b.Epoch())
	}
}

// TestQuorumCountsTheLastCommittedRing: a coordinator that still believes
// in a member across a partition proposes a ring with it; that ring never
// trains, and a majority of it is not a majority of the ring that did. (The
// quorum once counted the latest epoch, so in a 2+2 partition one side
// shrank 4 → 3 → 2 through an epoch that never trained and went on alone.)
func TestQuorumCountsTheLastCommittedRing(t *testing.T) {
	c := newCluster("a", "b", "c", "d")
	c.round(time.Second)
	trained := c.commit(t, []string{"a", "b", "c", "d"})
	// {a, b} | {c, d}, but a and b hear d a little longer than c.
	side := &cluster{views: map[string]*View{"a": c.views["a"], "b": c.views["b"], "d": c.views["d"]}, now: c.now, seq: c.seq, down: map[string]bool{}}
	for range 3 {
		side.round(2 * time.Second)
	}
	if e := c.views["a"].Epoch(); !slices.Equal(e.Order, []string{"a", "b", "d"}) {
		t.Fatalf("a's epoch %v, want [a b d] (3 of the 4 that trained)", e.Order)
	}
	side.down["d"] = true
	for range 4 {
		side.round(2 * time.Second)
	}
	if e := c.views["a"].Epoch(); !slices.Equal(e.Order, []string{"a", "b", "d"}) {
		t.Fatalf("a moved to epoch %d %v with 2 of the 4 members that last trained", e.Number, e.Order)
	}
	if w := c.views["a"].Waiting(); !strings.Contains(w, fmt.Sprintf("no quorum: 2 of the 4 members of epoch %d", trained.Number)) {
		t.Fatalf("Waiting() = %q", w)
	}
	// Had [a b d] trained a step, [a b] would be a majority of it.
	c.views["a"].Commit(c.views["a"].Epoch().Number)
	side.round(2 * time.Second)
	if e := c.views["a"].Epoch(); !slices.Equal(e.Order, []string{"a", "b"}) {
		t.Fatalf("after a commit of [a b d], a's epoch is %v, want [a b]", e.Order)
	}
}

// TestQuorumCountsNewcomers: a survivor that lost the quorum of its ring
// (one of two, the other crashed) goes on with a newcomer, whatever the
// order of the three peer IDs: the members that joined since the last
// committed ring count toward its quorum, voters and reachable alike. Until
// then the survivor proposes nothing alone. (When the newcomer's ID sorted
// after the survivor's, the survivor counted 1 of the 2 members of its
// ring, the newcomer followed it, and neither proposed a ring: training
// stalled for as long as the dead member stayed away.)
func TestQuorumCountsNewcomers(t *testing.T) {
	for _, ids := range [][3]string{ // survivor, crashed, newcomer
		{"a", "b", "c"}, {"a", "c", "b"}, {"b", "a", "c"},
		{"b", "c", "a"}, {"c", "a", "b"}, {"c", "b", "a"},
	} {
		survivor, crashed, newcomer := ids[0], ids[1], ids[2]
		t.Run(strings.Join(ids[:], ""), func(t *testing.T) {
			pair := []string{survivor, crashed}
			slices.Sort(pair)
			c := newCluster(survivor, crashed)
			c.round(time.Second)
			trained := c.commit(t, pair)
			c.down[crashed] = true
			for range 4 {
				c.round(2 * time.Second)
			}
			s := c.views[survivor]
			if st := stateOf(s, crashed); st != Dead {
				t.Fatalf("the crashed member is %v", st)
			}
			if e := s.Epoch(); e.Number != trained.Number {
				t.Fatalf("the survivor went on alone in epoch %d %v", e.Number, e.Order)
			}
			if w := s.Waiting(); !strings.Contains(w, "no quorum: 1 of the 2 members") {
				t.Fatalf("Waiting() = %q", w)
			}
			c.views[newcomer] = NewView(hb(newcomer, 0), testTiming, c.now)
			for range 3 {
				c.round(time.Second)
			}
			want := []string{survivor, newcomer}
			slices.Sort(want)
			if e := c.agree(t, want); e.Number <= trained.Number {
				t.Fatalf("epoch %d, want one after %d", e.Number, trained.Number)
			}
			if w := s.Waiting(); w != "" {
				t.Fatalf("Waiting() = %q after the ring re-formed", w)
			}
		})
	}
}

// TestQuorumNewcomersDoNotMakeAMinorityAMajority: newcomers count as
// members, not as a bonus: the one survivor of a ring of three, with one
// newcomer, holds 2 of 4 and proposes nothing (nor blames its coordinator
// for waiting); a second newcomer makes 3 of 5.
func TestQuorumNewcomersDoNotMakeAMinorityAMajority(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.round(time.Second)
	trained := c.commit(t, []string{"a", "b", "c"})
	c.down["b"], c.down["c"] = true, true
	for range 3 {
		c.round(2 * time.Second)
	}
	c.views["d"] = NewView(hb("d", 0), testTiming, c.now)
	for range 5 * int(testTiming.FailAfter/time.Second) {
		c.round(time.Second)
	}
	if e := c.views["a"].Epoch(); e.Number != trained.Number {
		t.Fatalf("a and one newcomer went on in epoch %d %v", e.Number, e.Order)
	}
	if w := c.views["a"].Waiting(); !strings.Contains(w, "no quorum: 2 of the 4 members") {
		t.Fatalf("Waiting() = %q", w)
	}
	if x := c.views["d"].OwnExclusions(); len(x) != 0 {
		t.Fatalf("the newcomer without a quorum excluded %v", x)
	}
	c.views["e"] = NewView(hb("e", 0), testTiming, c.now)
	c.round(time.Second)
	c.round(time.Second)
	c.agree(t, []string{"a", "d", "e"})
}

// TestAdoptionNeedsQuorumAcrossAPartition: a newcomer with the lowest peer
// ID that joins the minority of a partition proposes a ring of itself and
// the minority (it knows no ring that trained, so it counts a quorum of
// anything); the minority member refuses it, by its own count (2 of the 4
// members: its ring of three and the newcomer), says why, and counts the
// refusal once however often the newcomer's heartbeats carry it. On
// healing, the minority and the newcomer adopt one ring with the majority.
// (The minority member adopted the newcomer's ring: both sides of the
// partition trained, and the replicas forked.)
func TestAdoptionNeedsQuorumAcrossAPartition(t *testing.T) {
	c := newCluster("b", "c", "d")
	c.round(time.Second)
	trained := c.commit(t, []string{"b", "c", "d"})
	// {b, c} | {d}
	majority, minority := c.partition([]string{"b", "c"}, []string{"d"})
	maj := majority.commit(t, []string{"b", "c"})
	d := c.views["d"]
	if w := d.Waiting(); !strings.Contains(w, "no quorum: 1 of the 3 members") {
		t.Fatalf("the minority's Waiting() = %q", w)
	}
	// The newcomer a joins the minority's side.
	a := NewView(hb("a", 0), testTiming, minority.now)
	c.views["a"], minority.views["a"] = a, a
	for range 3 {
		majority.round(time.Second)
		minority.round(time.Second)
	}
	if e := a.Epoch(); !slices.Equal(e.Order, []string{"a", "d"}) {
		t.Fatalf("the newcomer is in epoch %d %v, want its own [a d]", e.Number, e.Order)
	}
	if e := d.Epoch(); e.Number != trained.Number {
		t.Fatalf("the minority member went on in epoch %d %v while the majority trains in %d %v", e.Number, e.Order, maj.Number, maj.Order)
	}
	n, err := d.Rejections()
	if n == 0 || !errors.Is(err, ErrEpochRejected) || !strings.Contains(err.Error(), "no quorum: it lists 2 of the 4 members") {
		t.Fatalf("%d rejections, the last %v", n, err)
	}
	if w := d.Waiting(); !strings.Contains(w, "no quorum: it lists 2 of the 4 members") || !strings.Contains(w, fmt.Sprint(a.Epoch().Number)) {
		t.Fatalf("the minority's Waiting() = %q", w)
	}
	for range 3 {
		majority.round(time.Second)
		minority.round(time.Second)
	}
	if again, _ := d.Rejections(); again != n {
		t.Fatalf("the same refusal counted %d times", again-n+1)
	}
	if x := d.OwnExclusions(); len(x) != 0 {
		t.Fatalf("the minority member excluded %v", x)
	}
	majority.agree(t, []string{"b", "c"})
	// Heal: one ring of all four, the minority adopting it.
	c.now, c.seq = majority.now, max(majority.seq, minority.seq) // both sides' clocks moved alike
	for range 2 {
		c.round(time.Second)
	}
	healed := c.agree(t, []string{"a", "b", "c", "d"})
	if healed.Number <= maj.Number {
		t.Fatalf("healed epoch %d, want one after the majority's %d", healed.Number, maj.Number)
	}
	for id, v := range c.views {
		if w := v.Waiting(); w != "" {
			t.Fatalf("%s still waits after the heal: %q", id, w)
		}
	}
}

// TestAdoptionCountsNewcomers: a member checks the quorum of every epoch
// that another member proposes by its own count, the last ring it trained
// in and the members that joined since, the proposer among them (its
// proposal says it trains now, even before its first heartbeat arrives).
// The survivor of a ring of two adopts a newcomer's ring of the two of
// them (2 of 3) whatever the IDs; the survivor of a ring of three does not
// (2 of 4) until a second newcomer is in it (3 of 5). A member's first
// epoch is adopted as before: it knows no ring to count.
func TestAdoptionCountsNewcomers(t *testing.T) {
	ring := func(ids ...string) (*View, Epoch) {
		v := NewView(hb(ids[0], 0), testTiming, t0)
		e := Epoch{Number: 4, Order: slices.Sorted(slices.Values(ids)), Coordinator: slices.Min(ids)}
		for _, id := range ids[1:] {
			v.Heartbeat(hb(id, 1), t0)
		}
		v.Offer(e, e.Coordinator, t0)
		v.Commit(e.Number)
		if v.Epoch().Number != e.Number || v.committed.Number != e.Number {
			t.Fatalf("%s did not adopt and commit %+v", ids[0], e)
		}
		v.Tick(t0.Add(testTiming.FailAfter)) // the others crash
		for _, id := range ids[1:] {
			if st := stateOf(v, id); st != Dead {
				t.Fatalf("%s is %v", id, st)
			}
		}
		return v, e
	}
	now := t0.Add(testTiming.FailAfter)
	// Survivor b of {b, c}; newcomer a, unheard of before its proposal.
	b, trained := ring("b", "c")
	e := Epoch{Number: trained.Number + 1, Order: []string{"a", "b"}, Coordinator: "a"}
	b.Offer(e, "a", now)
	if !b.Epoch().Equal(e) {
		t.Fatalf("the survivor of two refused a newcomer's ring: %v", b.lastRejection)
	}
	// Survivor b of {b, c, d}: one newcomer is not enough, two are.
	b, trained = ring("b", "c", "d")
	b.Heartbeat(hb("a", 1), now)
	e = Epoch{Number: trained.Number + 1, Order: []string{"a", "b"}, Coordinator: "a"}
	b.Offer(e, "a", now)
	if got := b.Epoch(); got.Number != trained.Number {
		t.Fatalf("the survivor of three adopted %v with one newcomer", got.Order)
	}
	if _, err := b.Rejections(); err == nil || !strings.Contains(err.Error(), "no quorum: it lists 2 of the 4 members (the 3 of epoch 4, the last ring that trained, and 1 that joined since), 3 needed") {
		t.Fatalf("the refusal: %v", err)
	}
	b.Heartbeat(hb("e", 1), now)
	e = Epoch{Number: trained.Number + 2, Order: []string{"a", "b", "e"}, Coordinator: "a"}
	b.Offer(e, "a", now)
	if !b.Epoch().Equal(e) {
		t.Fatalf("the survivor of three refused a ring with two newcomers: %v", b.lastRejection)
	}
	// A newcomer that another's ring leaves out counts against it: b hears
	// a and e, and a proposes a ring without e (2 of 4).
	b, trained = ring("b", "c")
	b.Heartbeat(hb("a", 1), now)
	b.Heartbeat(hb("e", 1), now)
	e = Epoch{Number: trained.Number + 1, Order: []string{"a", "b"}, Coordinator: "a"}
	b.Offer(e, "a", now)
	if got := b.Epoch(); got.Number != trained.Number {
		t.Fatalf("b adopted %v, 2 of the 4 members it counts", got.Order)
	}
	// A first epoch is adopted whatever it lists.
	x := NewView(hb("x", 0), testTiming, t0)
	for _, id := range []string{"b", "c", "d"} {
		x.Heartbeat(hb(id, 1), t0)
	}
	first := Epoch{Number: 1, Order: []string{"a"}, Coordinator: "a"}
	x.Offer(first, "a", t0)
	if !x.Epoch().Equal(first) {
		t.Fatalf("a first epoch was refused: %v", x.lastRejection)
	}
}

// TestUnreachableMemberIsNotExcluded: a member the failure detector holds
// dead when the trainer blames it (it missed train.ready_timeout, or its
// frames never came) is cut off, not misbehaving: it is not excluded, and
// rejoins the ring once it is heard again. (In a 2+2 partition each side
// excluded the other for not getting ready in an epoch it never received,
// and after the heal no side had a quorum for 10 minutes.)
func TestUnreachableMemberIsNotExcluded(t *testing.T) {
	c := newCluster("a", "b", "c", "d")
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c", "d"})
	c.down["c"], c.down["d"] = true, true
	for range 3 {
		c.round(2 * time.Second)
	}
	a := c.views["a"]
	for _, id := range []string{"c", "d"} {
		if d := a.Exclude(id, "not ready", c.now); d != 0 {
			t.Fatalf("excluded %s, which this view holds dead, for %s", id, d)
		}
	}
	if d := a.Exclude("b", "not ready", c.now); d != DefaultExcludeFor {
		t.Fatalf("a live member that misbehaves: back-off %s, want %s", d, DefaultExcludeFor)
	}
	// The heal: c and d are heard again and back in the coordinator's ring.
	c.down["c"], c.down["d"] = false, false
	c.round(time.Second)
	c.round(time.Second)
	if e := a.Epoch(); !slices.Equal(e.Order, []string{"a", "c", "d"}) {
		t.Fatalf("after the heal a's epoch is %v, want [a c d] (b excluded, c and d back)", e.Order)
	}
}

// TestProposalFromAnObserverTurnedTrainerIsFollowed: a peer that starts
// training proposes an epoch that may arrive before its heartbeat saying it
// is no observer any more; the proposal itself says so, and it is adopted.
// (Refused, the receiver proposed a ring of its own; with 1 % packet loss
// the two disagreed until one excluded the other for the whole back-off.)
func TestProposalFromAnObserverTurnedTrainerIsFollowed(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.views["a"].members["a"].Observer = true
	for _, v := range c.views {
		for _, id := range []string{"a", "b", "c"} {
			h := hb(id, 1)
			h.Observer = id == "a"
			v.Heartbeat(h, c.now)
		}
	}
	c.settle()
	before := c.agree(t, []string{"b", "c"})
	// a starts training and proposes at once; b and c still hold it an observer.
	c.views["a"].members["a"].Observer = false
	e, ok := c.views["a"].Proposal(0)
	if !ok || !slices.Equal(e.Order, []string{"a", "b", "c"}) || e.Number <= before.Number {
		t.Fatalf("a's proposal %+v, %v", e, ok)
	}
	for _, id := range []string{"b", "c"} {
		c.views[id].Offer(e, "a", c.now)
		if got := c.views[id].Epoch(); !got.Equal(e) {
			t.Fatalf("%s refused the proposal of a trainer it held an observer: holds %+v", id, got)
		}
	}
}

// TestMajorityExclusionIsShared: members that a majority of the ring
// excludes are excluded by everyone, so a peer that never saw the member
// misbehave stops following it as coordinator. (In the chaos suite the
// poisoning member had the lowest ID; one honest peer never fetched its
// state, kept following it, and the others excluded that peer in turn.)
// One member's exclusion alone is not shared.
func TestMajorityExclusionIsShared(t *testing.T) {
	c := newCluster("a", "b", "c", "d")
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c", "d"})
	c.views["b"].Exclude("a", "served a poisoned state", c.now)
	c.round(time.Second)
	if got := c.views["d"].Coordinator(); got != "a" {
		t.Fatalf("one member's exclusion was shared: d's coordinator is %s", got)
	}
	c.views["c"].Exclude("a", "served a poisoned state", c.now)
	c.round(time.Second)
	c.round(time.Second)
	d := c.views["d"]
	if got := d.Coordinator(); got != "b" {
		t.Fatalf("d's coordinator is %s, want b (a is excluded by b and c)", got)
	}
	if until, why := d.Excluded("a"); until.IsZero() || !strings.Contains(why, "excluded by 2 of the 3") {
		t.Fatalf("d.Excluded(a) = %v, %q", until, why)
	}
	c.agree(t, []string{"b", "c", "d"})
	// a's proposals are refused now, however new.
	before := d.Epoch()
	d.Offer(Epoch{Number: before.Number + 1, Order: []string{"a", "d"}, Coordinator: "a"}, "a", c.now)
	if d.Epoch().Number != before.Number {
		t.Fatal("d adopted a proposal of a member the majority excludes")
	}
}

// TestMemberProposingAForgedNumberIsExcluded: a member that proposes an
// epoch of its own making with a number no honest member can hold is
// excluded at once, so it stops being anyone's coordinator. (The chaos
// suite's epoch forger, holding the lowest peer ID, kept a cluster from
// its first step: every peer followed it as coordinator and it proposed
// only forged epochs.) A peer that has adopted no epoch yet refuses a
// large jump but does not hold it against the proposer: it may have joined
// a ring whose numbering is far along.
func TestMemberProposingAForgedNumberIsExcluded(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.round(time.Second)
	good := c.agree(t, []string{"a", "b", "c"})
	for _, n := range []uint64{MaxEpochNumber + 1, good.Number + MaxEpochJump + 1} {
		v := NewView(hb("b", 0), testTiming, c.now)
		v.Heartbeat(hb("a", 1), c.now)
		v.epoch = good
		forged := Epoch{Number: n, Order: []string{"a"}, Coordinator: "a"}
		evs := slices.Concat(v.Offer(forged, "a", c.now), v.Offer(forged, "a", c.now))
		if until, why := v.Excluded("a"); until.IsZero() || !strings.Contains(why, "no honest member") {
			t.Fatalf("epoch %d: forger not excluded (%v, %q)", n, until, why)
		}
		if len(evs) != 1 || evs[0].Exclusion == nil || evs[0].Exclusion.For != DefaultExcludeFor {
			t.Fatalf("epoch %d offered twice: events %+v, want one exclusion for %s", n, evs, DefaultExcludeFor)
		}
		if got := v.Coordinator(); got != "b" {
			t.Fatalf("epoch %d: coordinator %q after the forger's exclusion, want b", n, got)
		}
	}
	// A forwarded copy of someone else's forged epoch, and a jump seen by a
	// peer with no epoch yet, are refused without an exclusion.
	fresh := NewView(hb("b", 0), testTiming, c.now)
	fresh.Heartbeat(hb("a", 1), c.now)
	fresh.Offer(Epoch{Number: MaxEpochJump + 2, Order: []string{"a"}, Coordinator: "a"}, "a", c.now)
	fresh.Offer(Epoch{Number: MaxEpochNumber + 1, Order: []string{"z"}, Coordinator: "z"}, "a", c.now)
	if until, _ := fresh.Excluded("a"); !until.IsZero() {
		t.Fatal("a peer with no epoch excluded a proposer for a jump, or a member for forwarding")
	}
	if n, _ := fresh.Rejections(); n != 2 {
		t.Fatalf("%d rejections, want 2", n)
	}
}

// TestCoordinatorThatNeverProposesIsExcluded: a member with the lowest
// peer ID that heartbeats but never proposes is excluded by the others
// after Timing.ProposeTimeout (twice FailAfter by default), and the next
// lowest forms the ring without it. Before that, nothing is proposed.
// (A view starts the wait at the first tick after it heard the
// coordinator, one heartbeat interval late at most; a few rounds more let
// the views that excluded it last adopt the new ring.)
func TestCoordinatorThatNeverProposesIsExcluded(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.mute["a"] = true
	c.round(time.Second)
	for elapsed := time.Second; elapsed < 2*testTiming.FailAfter; elapsed += time.Second {
		if n := c.views["b"].Epoch().Number; n != 0 {
			t.Fatalf("epoch %d adopted after %s, before the coordinator's time ran out", n, elapsed)
		}
		c.round(time.Second)
	}
	for range 4 {
		c.round(time.Second)
	}
	for _, id := range []string{"b", "c"} {
		if until, why := c.views[id].Excluded("a"); until.IsZero() || !strings.Contains(why, "proposed no ring epoch") {
			t.Fatalf("%s: silent coordinator not excluded (%v, %q)", id, until, why)
		}
	}
	c.down["a"] = true // it follows nobody; the others' agreement is what counts
	c.agree(t, []string{"b", "c"})
}

// TestCoordinatorLeavingOutItsExclusionsIsNotBlamed: a coordinator that
// leaves out a member it excludes (its heartbeat says so) is doing its
// job, although this view does not exclude that member; and a view
// without a quorum blames no coordinator for waiting.
func TestCoordinatorLeavingOutItsExclusionsIsNotBlamed(t *testing.T) {
	c := newCluster("a", "b", "c")
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c"})
	c.views["a"].Exclude("c", "test", c.now)
	c.round(time.Second)
	c.agree(t, []string{"a", "b"})
	for range 5 * int(testTiming.FailAfter/time.Second) {
		c.round(time.Second)
	}
	if until, _ := c.views["b"].Excluded("a"); !until.IsZero() {
		t.Fatal("b excluded a coordinator that left out a member it excludes")
	}
	// b and c alone in a ring of five that trained: no quorum, no blame.
	d := newCluster("a", "b", "c", "d", "e")
	d.round(time.Second)
	d.agree(t, []string{"a", "b", "c", "d", "e"})
	for _, v := range d.views {
		v.Commit(v.Epoch().Number)
	}
	d.down["a"], d.down["d"], d.down["e"] = true, true, true
	for range 5 * int(testTiming.FailAfter/time.Second) {
		d.round(time.Second)
	}
	for _, id := range []string{"b", "c"} {
		if x := d.views[id].OwnExclusions(); len(x) != 0 {
			t.Fatalf("%s without a quorum excluded %v", id, x)
		}
	}
}

// TestCoordinatorSeeingOtherMembersIsNotBlamed: a coordinator whose ring
// leaves out a member this view holds alive (its failure detector holds
// it dead: views differ) is not excluded for that; only a need every view
// sees alike counts. (Under the chaos suite's frame flood, the others once
// excluded a coordinator that had missed a member's heartbeats.)
func TestCoordinatorSeeingOtherMembersIsNotBlamed(t *testing.T) {
	v := NewView(hb("b", 0), testTiming, t0)
	e := Epoch{Number: 1, Order: []string{"a", "b", "c"}, Coordinator: "a"}
	now := t0
	for seq := uint64(1); seq <= 40; seq++ {
		now = now.Add(time.Second)
		for _, id := range []string{"a", "c", "x"} {
			h := hb(id, seq)
			if id == "a" {
				h.Epoch = e
			}
			v.Heartbeat(h, now)
		}
		v.Tick(now)
	}
	if v.Epoch().Number != 1 {
		t.Fatalf("epoch %d, want a's epoch 1", v.Epoch().Number)
	}
	if until, why := v.Excluded("a"); !until.IsZero() {
		t.Fatalf("the coordinator was excluded: %s", why)
	}
}

// TestDraftGoesStaleWhenTheViewChanges: a proposal laid out from a draft
// (the planner's part, run without the Service's lock) is proposed only if
// the view still calls for it when it completes: a member that came back,
// or an epoch adopted meanwhile, makes it stale, and the next draft has the
// new members; a heartbeat that only brings newer link figures does not.
// The planner runs once per draft.
func TestDraftGoesStaleWhenTheViewChanges(t *testing.T) {
	c := newCluster("a", "b", "c")
	p := &fakePlanner{}
	a := c.views["a"]
	a.SetPlanner(p, 0)
	c.round(time.Second)
	c.agree(t, []string{"c", "b", "a"})
	c.down["c"] = true
	c.mute["a"] = true
	c.round(6 * time.Second)

	d, ok := a.Draft(0, c.now, false)
	if !ok {
		t.Fatal("no draft after c died")
	}
	d.Plan()
	c.down["c"] = false
	c.round(time.Second) // c is back while the layout is under way
	if e, ok := a.Complete(d, c.now); ok {
		t.Fatalf("proposed %+v laid out before c came back", e)
	}
	if d, ok := a.Draft(0, c.now, false); ok {
		t.Fatalf("drafted %+v with the epoch's members live", d)
	}

	c.down["c"] = true
	c.round(6 * time.Second)
	d, ok = a.Draft(0, c.now, false)
	if !ok {
		t.Fatal("no draft after c died again")
	}
	plans := p.plans
	d.Plan()
	h := hb("b", 1000)
	h.Epoch = a.Epoch()
	h.Links = []LinkFigure{{Peer: "a", MbitS: 100, RTTMs: 1}}
	a.Heartbeat(h, c.now)
	stale, ok := a.Draft(0, c.now, false) // drafted now, completed after d's epoch
	if !ok {
		t.Fatal("no second draft")
	}
	e, ok := a.Complete(d, c.now)
	if !ok || !slices.Equal(e.Order, []string{"b", "a"}) || p.plans != plans+1 {
		t.Fatalf("proposal %+v ok=%v after %d layouts: want b a, laid out once despite newer links", e, ok, p.plans-plans)
	}
	a.Offer(e, "a", c.now)
	if e, ok := a.Complete(stale, c.now); ok {
		t.Fatalf("proposed %+v drafted before epoch %d was adopted", e, a.Epoch().Number)
	}
}

// TestSharedExclusionFollowsTheLatestHeartbeats: a majority's exclusion
// holds while the latest heartbeats of a majority list it (a member listing
// it twice counts once) and ends as soon as they stop, also once the
// members that listed it are forgotten.
func TestSharedExclusionFollowsTheLatestHeartbeats(t *testing.T) {
	c := newCluster("a", "b", "c", "d")
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c", "d"})
	d := c.views["d"]
	seq := c.seq + 100
	say := func(id string, excluded ...string) {
		seq++
		h := hb(id, seq)
		h.Epoch, h.Excluded = d.Epoch(), excluded
		d.Heartbeat(h, c.now)
	}
	check := func(what string, excluded bool, coordinator string) {
		t.Helper()
		until, why := d.Excluded("a")
		if until.IsZero() == excluded || excluded && !strings.Contains(why, "excluded by 2 of the 3") {
			t.Fatalf("%s: d.Excluded(a) = %v, %q; want excluded %v", what, until, why, excluded)
		}
		if got := d.Coordinator(); got != coordinator {
			t.Fatalf("%s: d's coordinator is %s, want %s", what, got, coordinator)
		}
	}
	say("b", "a")
	say("c", "a", "a")
	check("b and c list a", true, "b")
	say("c")
	check("c stopped listing a", false, "a")
	say("c", "a")
	check("c lists a again", true, "b")
	c.down["b"], c.down["c"] = true, true
	c.round(6 * time.Second) // b and c are dead in d's view
	c.round(time.Minute)     // and forgotten
	if st := stateOf(d, "b"); st != -1 {
		t.Fatalf("b is %v in d's view, want forgotten", st)
	}
	check("b and c forgotten", false, "a")
}

// TestAdoptionWithoutACommitIsUnchecked: a member that never completed a
// step in a ring adopts what its coordinator proposes. (A newcomer counted
// against the first, big epoch it adopted; once half of it died before a
// step, it refused every ring the survivors proposed.)
func TestAdoptionWithoutACommitIsUnchecked(t *testing.T) {
	c := newCluster("a", "b")
	c.round(time.Second)
	c.commit(t, []string{"a", "b"})
	for _, id := range []string{"c", "d", "e", "f"} {
		c.views[id] = NewView(hb(id, 0), testTiming, c.now)
	}
	c.round(time.Second)
	c.round(time.Second)
	c.agree(t, []string{"a", "b", "c", "d", "e", "f"})
	c.down["d"], c.down["e"], c.down["f"] = true, true, true // before any step of that epoch
	for range 6 {
		c.round(2 * time.Second)
	}
	c.agree(t, []string{"a", "b", "c"})
}

// TestStaleMemberWaitsAfterTheOthersShrank: a member away while the others
// shrank by crashes through rings that each kept a majority of the one
// before (6 → 5 → 3 → 2) counts its own last ring, of six; the ring of the
// two and itself lists only 3 of them, and it refuses it and says why. It
// waits until it restarts (docs/failures.md, Known gaps): every rule tried
// that let it follow the others on their announcements let a minority
// train in some other sequence (TestStaleMembersDoNotFollowIntoAMinority,
// TestStaleMemberIsNoTieBreaker).
func TestStaleMemberWaitsAfterTheOthersShrank(t *testing.T) {
	all := []string{"a", "b", "c", "d", "e", "f"}
	c := newCluster(all...)
	c.round(time.Second)
	c.commit(t, all)
	majority, minority := c.partition(all[:5], []string{"f"})
	majority.commit(t, all[:5])
	for _, shrink := range [][]string{{"a", "b", "c"}, {"a", "b"}} {
		for _, id := range all[len(shrink):5] {
			majority.down[id] = true
		}
		for range 3 {
			majority.round(2 * time.Second)
			minority.round(2 * time.Second)
		}
		majority.commit(t, shrink)
	}
	// Heal: f hears a and b again; c, d and e stay down.
	c.now, c.seq = majority.now, max(majority.seq, minority.seq)
	c.down = majority.down
	for range 3 {
		c.round(time.Second)
	}
	f := c.views["f"]
	if e := f.Epoch(); slices.Contains(e.Order, "f") && len(e.Order) == 3 {
		t.Fatalf("f adopted %v", e.Order)
	}
	if w := f.Waiting(); !strings.Contains(w, "no quorum: it lists 3 of the 6 members") {
		t.Fatalf("f's Waiting() = %q", w)
	}
}

// TestStalledCoordinatorWhoseEpochsWereRefused: a coordinator whose
// proposals this member refused (no quorum by its count) is excluded after
// the propose timeout like one that proposed nothing, and the reason says
// which epoch was refused and why, not that it proposed none.
func TestStalledCoordinatorWhoseEpochsWereRefused(t *testing.T) {
	b := NewView(hb("b", 0), testTiming, t0)
	for _, id := range []string{"c", "d"} {
		b.Heartbeat(hb(id, 1), t0)
	}
	trained := Epoch{Number: 4, Order: []string{"b", "c", "d"}, Coordinator: "b"}
	b.Offer(trained, "b", t0)
	b.Commit(trained.Number)
	now := t0.Add(testTiming.FailAfter)
	b.Tick(now) // c and d crash
	beat := func(seq uint64) {
		b.Heartbeat(hb("a", seq), now)
		e := hb("e", seq)
		e.WantEpoch = trained.Number // e asks for a new ring
		b.Heartbeat(e, now)
	}
	beat(1)
	// a proposes a ring without e: 2 of the 5 members b counts.
	b.Offer(Epoch{Number: 5, Order: []string{"a", "b"}, Coordinator: "a"}, "a", now)
	if b.Epoch().Number != trained.Number {
		t.Fatalf("b adopted %v", b.Epoch().Order)
	}
	var reason string
	for seq := uint64(2); seq < 20 && reason == ""; seq++ {
		now = now.Add(time.Second)
		beat(seq)
		for _, ev := range b.Tick(now) {
			if x := ev.Exclusion; x != nil && x.Peer == "a" {
				reason = x.Reason
			}
		}
	}
	if !strings.Contains(reason, "proposed no ring epoch this member could adopt") || !strings.Contains(reason, "it refused epoch 5") ||
		!strings.Contains(reason, "(it refused epoch 5: no quorum: it lists 2 of the 5 members") {
		t.Fatalf("exclusion reason %q", reason)
	}
}

// TestStaleMembersDoNotFollowIntoAMinority: stale members, whom a proposer
// counts toward its own quorum as members that joined since its ring, are
// not led into a minority's ring while the majority of that ring trains
// on. Two sequences of honest members, crashes and partitions, each of
// which trained on both sides when a stale member followed a proposer that
// announced a newer committed ring (a rule tried and withdrawn):
//   - 7 → {a..e} (f and g away) → {a, b, c} (d and e crash), then
//     {a, f, g} | {b, c}: a counts 3 of the 5 it knows (its ring and f and
//     g), but {a, f, g} lists only a of its ring {a, b, c};
//   - {a..e} → {a, b, c} (d and e away), in which only a completes a step,
//     then {a, b} | {c, d, e}: {a, b} lists 2 of a's ring {a, b, c}, but
//     only a announces it committed.
func TestStaleMembersDoNotFollowIntoAMinority(t *testing.T) {
	catchUp := func(c *cluster, sides ...*cluster) {
		for _, s := range sides {
			c.now, c.seq = maxTime(c.now, s.now), max(c.seq, s.seq)
		}
	}
	t.Run("stale members counted as joined", func(t *testing.T) {
		all := []string{"a", "b", "c", "d", "e", "f", "g"}
		c := newCluster(all...)
		c.round(time.Second)
		c.commit(t, all)
		maj, away := c.partition(all[:5], []string{"f", "g"})
		maj.commit(t, all[:5])
		maj.down["d"], maj.down["e"] = true, true
		for range 3 {
			maj.round(2 * time.Second)
			away.round(2 * time.Second)
		}
		maj.commit(t, []string{"a", "b", "c"})
		catchUp(c, maj, away)
		left, right := c.partition([]string{"a", "f", "g"}, []string{"b", "c"})
		if trainsOn(left, []string{"a", "f", "g"}) && trainsOn(right, []string{"b", "c"}) {
			t.Fatal("{a, f, g} and {b, c} both train")
		}
	})
	t.Run("a ring only its proposer committed", func(t *testing.T) {
		all := []string{"a", "b", "c", "d", "e"}
		c := newCluster(all...)
		c.round(time.Second)
		c.commit(t, all)
		maj, away := c.partition([]string{"a", "b", "c"}, []string{"d", "e"})
		maj.views["a"].Commit(maj.agree(t, []string{"a", "b", "c"}).Number) // b and c never complete the step
		catchUp(c, maj, away)
		left, right := c.partition([]string{"a", "b"}, []string{"c", "d", "e"})
		if trainsOn(left, []string{"a", "b"}) && trainsOn(right, []string{"c", "d", "e"}) {
			t.Fatal("{a, b} and {c, d, e} both train")
		}
	})
}

// TestStaleMemberIsNoTieBreaker: a stale member does not follow a ring
// whose members have committed a later ring since, whose majority may
// train elsewhere (a rule tried and withdrawn let it). R = {a,b,c,u,w,x,y,z} commits; x goes away; the others
// shrink by crashes to C = {a,b,c}, a's last ring; a is cut off, and b and
// c take in newcomers d, f, g: D = {b,c,d,f,g} commits; then {a,b,c,x} |
// {d,f,g}. {d,f,g} hold 3 of D and train; a counts {a,b,c,x} 4 of 4 (x as
// joined), b and c 4 of 7; x counts 4 of R's 8 and must refuse, though all
// of C announce a committed ring at least C's: with x, {a,b,c,x} would
// train too.
func TestStaleMemberIsNoTieBreaker(t *testing.T) {
	all := []string{"a", "b", "c", "u", "w", "x", "y", "z"}
	c := newCluster(all...)
	c.round(time.Second)
	c.commit(t, all)
	maj, away := c.partition([]string{"a", "b", "c", "u", "w", "y", "z"}, []string{"x"})
	maj.commit(t, []string{"a", "b", "c", "u", "w", "y", "z"})
	for _, crash := range [][]string{{"u", "w"}, {"y", "z"}} {
		for _, id := range crash {
			maj.down[id] = true
		}
		for range 3 {
			maj.round(2 * time.Second)
			away.round(2 * time.Second)
		}
		maj.commit(t, maj.views["a"].Epoch().Order)
	}
	maj.agree(t, []string{"a", "b", "c"})
	now, seq := maxTime(maj.now, away.now), max(maj.seq, away.seq)
	views := c.views
	for _, id := range []string{"d", "f", "g"} {
		views[id] = NewView(hb(id, 0), testTiming, now)
	}
	ax, bc, xs := sideOf(now, seq, views, "a"), sideOf(now, seq, views, "b", "c", "d", "f", "g"), sideOf(now, seq, views, "x")
	for range 4 {
		ax.round(2 * time.Second)
		xs.round(2 * time.Second)
		bc.round(2 * time.Second)
	}
	ax.views["x"] = views["x"] // a reaches x
	for range 4 {
		ax.round(2 * time.Second)
		bc.round(2 * time.Second)
	}
	bc.commit(t, []string{"b", "c", "d", "f", "g"})
	now, seq = maxTime(ax.now, bc.now), max(ax.seq, bc.seq)
	g1, g2 := sideOf(now, seq, views, "a", "b", "c", "x"), sideOf(now, seq, views, "d", "f", "g")
	for range 6 {
		g1.round(2 * time.Second)
		g2.round(2 * time.Second)
	}
	if trainsOn(g1, []string{"a", "b", "c", "x"}) && trainsOn(g2, []string{"d", "f", "g"}) {
		t.Fatal("{a, b, c, x} and {d, f, g} both train")
	}
}

// sideOf is a cluster of the given views (shared with their owners) at
// time now and sequence seq.
func sideOf(now time.Time, seq uint64, views map[string]*View, ids ...string) *cluster {
	s := &cluster{views: map[string]*View{}, now: now, seq: seq, down: map[string]bool{}, mute: map[string]bool{}}
	for _, id := range ids {
		s.views[id] = views[id]
	}
	return s
}

// trainsOn reports whether every view of side holds one epoch of order.
func trainsOn(side *cluster, order []string) bool {
	var first Epoch
	for _, v := range side.views {
		e := v.Epoch()
		if !slices.Equal(e.Order, order) || first.Number != 0 && !first.Equal(e) {
			return false
		}
		first = e
	}
	return true
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// TestMemberChangeSaysNew: a member heard for the first time changes from
// "new", one heard again after it was declared dead from "dead", so that
// logs and events do not read a first sighting as a recovery.
func TestMemberChangeSaysNew(t *testing.T) {
	v := NewView(hb("a", 0), testTiming, t0)
	first := v.Heartbeat(hb("b", 1), t0)
	if len(first) != 1 || first[0].Member == nil || !first[0].Member.New || first[0].Member.FromText() != "new" || first[0].Member.To != Alive {
		t.Fatalf("first heartbeat: %+v", first)
	}
	v.Tick(t0.Add(testTiming.FailAfter)) // b is declared dead
	again := v.Heartbeat(hb("b", 2), t0.Add(testTiming.FailAfter+time.Second))
	if len(again) != 1 || again[0].Member == nil || again[0].Member.New || again[0].Member.FromText() != "dead" {
		t.Fatalf("heartbeat after death: %+v", again)
	}
	// A member an adopted epoch lists before this view heard it is new too.
	evs := v.Offer(Epoch{Number: 1, Order: []string{"a", "b", "c"}, Coordinator: "a"}, "a", t0.Add(testTiming.FailAfter+time.Second))
	var c *MemberChange
	for _, ev := range evs {
		if ev.Member != nil && ev.Member.Peer == "c" {
			c = ev.Member
		}
	}
	if c == nil || c.FromText() != "new" {
		t.Fatalf("events of the epoch that lists c: %+v", evs)
	}
}
