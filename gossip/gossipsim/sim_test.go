package gossipsim

import (
	"container/heap"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/plan"
)

var (
	peersFlag = flag.String("sim.peers", "16,64", "comma-separated cluster sizes TestControlPlaneConverges simulates")
	codecFlag = flag.String("sim.codec", "none", "allreduce.codec the simulated planner lays epochs out for")
)

// The simulated cluster's settings: p2ptrain's defaults (gossip.heartbeat
// 1 s, gossip.failure_timeout 5 s, probe.replan_interval 1 min).
const (
	interval    = time.Second
	failAfter   = 5 * time.Second
	replanEvery = time.Minute
	// dropRate is the share of deliveries the network loses.
	dropRate = 0.01
	// planDelay is how long, in simulated time, a layout takes: the whole
	// budget (50 ms at 256 peers), so that gossip goes on while it runs,
	// as it does in Service. The planner's wall time is measured apart.
	planDelay = 50 * time.Millisecond
	// checkEvery is the resolution of the convergence check.
	checkEvery = interval / 10
	// rackSize peers share a rack: fast links and short RTTs inside one,
	// slower and longer ones between racks.
	rackSize = 8
)

var t0 = time.Unix(1_700_000_000, 0)

// link is one pair's measured figures and its one-way network delay.
type link struct {
	mbit  float64
	rtt   time.Duration
	delay time.Duration
}

// node is one peer: a View driven like Service drives one (heartbeat on
// every tick, propose after every message and tick, one layout at a time,
// at most one proposal per interval).
type node struct {
	idx          int
	id           string
	view         *gossip.View
	seq          uint64
	up           bool
	links        []gossip.LinkFigure
	lastProposal time.Time
	planning     bool
	// draftWall and draftCPU are how long Draft held the (simulated) lock
	// for the layout under way.
	draftWall, draftCPU time.Duration
}

// event is a delivery (env set), a tick, or a finished layout (draft set)
// for node to; seq orders events at the same instant.
type event struct {
	at    time.Time
	seq   uint64
	to    *node
	env   *gossip.Envelope
	tick  bool
	draft *gossip.Draft
}

type queue []*event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// counters are what a phase of the simulation costs.
type counters struct {
	// Messages published by type (proposals are the epochs); delivered
	// copies; layouts not proposed (stale, or a re-plan the planner judged
	// not worth an epoch).
	heartbeats, proposals, leaves, delivered, dropped int
	// planWall and planCPU are the planner's wall and CPU time (threadCPU)
	// per layout of at least fullLayout members; lockWall and lockCPU the
	// time the Service's lock is held per published proposal (Draft,
	// Complete and Offer).
	planWall, planCPU, lockWall, lockCPU []time.Duration
}

// sim is a cluster of Views on a simulated network and clock.
type sim struct {
	rng     *rand.Rand
	now     time.Time
	q       queue
	seq     uint64
	nodes   []*node
	pairs   map[[2]int]link
	planner gossip.Planner
	c       counters
	// fullLayout is the least number of members a layout needs for its
	// wall time to count (counters.planWall): the cold start's partial
	// layouts would make the median say little.
	fullLayout int
}

func newSim(seed uint64, codec string) *sim {
	return &sim{
		rng:   rand.New(rand.NewPCG(seed, 0x5eed)),
		now:   t0,
		pairs: map[[2]int]link{},
		planner: plan.NewPlanner(plan.Settings{Schedule: "auto", BucketBytes: allreduce.DefaultBucketBytes,
			Codec: codec, LinkCodecs: plan.LinkCodecsAuto}),
	}
}

// pair returns the figures of the link between nodes i and j, drawn the
// first time they are asked for.
func (s *sim) pair(i, j int) link {
	k := [2]int{min(i, j), max(i, j)}
	if l, ok := s.pairs[k]; ok {
		return l
	}
	l := link{mbit: 600 + 400*s.rng.Float64(), rtt: time.Duration(200+300*s.rng.Float64()) * time.Microsecond}
	if i/rackSize != j/rackSize {
		l = link{mbit: 30 + 70*s.rng.Float64(), rtt: time.Duration(5+45*s.rng.Float64()) * time.Millisecond}
	}
	l.delay = l.rtt / 2
	s.pairs[k] = l
	return l
}

// addNode creates node id (index len(s.nodes)) with the link figures a
// prober would report to the first total peers: its rack first, then
// others at random, gossip.MaxLinks at most.
func (s *sim) addNode(id string, total int) *node {
	n := &node{idx: len(s.nodes), id: id}
	var others []int
	for j := range total {
		if j != n.idx {
			others = append(others, j)
		}
	}
	slices.SortStableFunc(others, func(a, b int) int {
		ra, rb := a/rackSize == n.idx/rackSize, b/rackSize == n.idx/rackSize
		switch {
		case ra && !rb:
			return -1
		case rb && !ra:
			return 1
		}
		return 0
	})
	rack := 0
	for _, j := range others {
		if j/rackSize == n.idx/rackSize {
			rack++
		}
	}
	s.rng.Shuffle(len(others)-rack, func(a, b int) { others[rack+a], others[rack+b] = others[rack+b], others[rack+a] })
	for _, j := range others[:min(len(others), gossip.MaxLinks)] {
		l := s.pair(n.idx, j)
		n.links = append(n.links, gossip.LinkFigure{Peer: peerID(j), MbitS: l.mbit, RTTMs: float64(l.rtt) / 1e6})
	}
	s.nodes = append(s.nodes, n)
	return n
}

func peerID(i int) string { return fmt.Sprintf("p%04d", i) }

func (s *sim) push(e *event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.q, e)
}

// start brings n up at at (a tick event for a node without a view): its
// first heartbeat at once, its first tick a random part of an interval
// later (Service staggers it the same way).
func (s *sim) start(n *node, at time.Time) {
	s.push(&event{at: at, to: n, tick: true})
}

// run processes events up to until.
func (s *sim) run(until time.Time) {
	for len(s.q) > 0 && !s.q[0].at.After(until) {
		e := heap.Pop(&s.q).(*event)
		s.now = e.at
		n := e.to
		switch {
		case e.tick && n.view == nil: // start
			hb := gossip.Heartbeat{PeerID: n.id, Name: n.id, Version: "sim", Links: n.links}
			n.view = gossip.NewView(hb, gossip.DefaultTiming(interval, failAfter), s.now)
			n.view.SetPlanner(s.planner, replanEvery)
			n.up = true
			s.heartbeat(n)
			s.push(&event{at: s.now.Add(time.Duration(s.rng.Int64N(int64(interval))) + 1), to: n, tick: true})
		case !n.up:
		case e.tick:
			n.view.Tick(s.now)
			n.view.Commit(n.view.Epoch().Number) // its trainer completes steps in the adopted epoch
			s.propose(n, true)
			s.heartbeat(n)
			s.push(&event{at: s.now.Add(interval), to: n, tick: true})
		case e.draft != nil:
			s.complete(n, e.draft)
		case e.env.Heartbeat != nil:
			n.view.Heartbeat(*e.env.Heartbeat, s.now)
			s.propose(n, false)
		case e.env.Leave != nil:
			n.view.Leave(*e.env.Leave, s.now)
			s.propose(n, false)
		case e.env.Epoch != nil:
			n.view.Offer(*e.env.Epoch, e.env.Epoch.Coordinator, s.now)
			s.propose(n, false)
		}
	}
	s.now = until
}

// broadcast sends env from n to every other peer that is up, each copy
// after the pair's one-way delay (up to twice it: gossipsub may relay it
// once) unless the network drops it.
func (s *sim) broadcast(from *node, env *gossip.Envelope) {
	for _, to := range s.nodes {
		if to == from || !to.up {
			continue
		}
		if s.rng.Float64() < dropRate {
			continue
		}
		d := s.pair(from.idx, to.idx).delay
		d += time.Duration(s.rng.Int64N(int64(d) + 1))
		s.c.delivered++
		s.push(&event{at: s.now.Add(d), to: to, env: env})
	}
}

func (s *sim) heartbeat(n *node) {
	n.seq++
	hb := gossip.Heartbeat{PeerID: n.id, Name: n.id, Version: "sim", Seq: n.seq, Epoch: n.view.Epoch(),
		Excluded: n.view.OwnExclusions(), Links: n.links}
	n.view.UpdateSelf(hb, s.now)
	s.c.heartbeats++
	s.broadcast(n, &gossip.Envelope{Type: gossip.TypeHeartbeat, Heartbeat: &hb})
}

// propose is Service.propose: a draft under the lock, the layout without
// it (its result arrives planDelay later), one at a time.
func (s *sim) propose(n *node, replan bool) {
	if n.planning || s.now.Sub(n.lastProposal) < interval {
		return
	}
	c, t := threadCPU(), time.Now()
	d, ok := n.view.Draft(0, s.now, replan)
	wall, cpu := time.Since(t), threadCPU()-c
	if !ok {
		return
	}
	n.planning, n.draftWall, n.draftCPU = true, wall, cpu
	members := len(n.view.Live())
	c, t = threadCPU(), time.Now()
	d.Plan()
	if wall, cpu := time.Since(t), threadCPU()-c; members >= s.fullLayout {
		s.c.planWall, s.c.planCPU = append(s.c.planWall, wall), append(s.c.planCPU, cpu)
	}
	s.push(&event{at: s.now.Add(planDelay), to: n, draft: d})
}

// complete is Service.complete: the layout becomes a proposal if the view
// still calls for it.
func (s *sim) complete(n *node, d *gossip.Draft) {
	n.planning = false
	c, t := threadCPU(), time.Now()
	e, ok := n.view.Complete(d, s.now)
	if ok {
		n.view.Offer(e, n.id, s.now)
	}
	wall, cpu := n.draftWall+time.Since(t), n.draftCPU+threadCPU()-c
	if !ok {
		s.c.dropped++
		return
	}
	n.lastProposal = s.now
	s.c.proposals++
	s.c.lockWall, s.c.lockCPU = append(s.c.lockWall, wall), append(s.c.lockCPU, cpu)
	s.broadcast(n, &gossip.Envelope{Type: gossip.TypeEpoch, Epoch: &e})
}

// kill stops n without a word (a crash); leave announces its departure
// first.
func (s *sim) kill(n *node) { n.up = false }

func (s *sim) leave(n *node) {
	n.seq++
	s.c.leaves++
	s.broadcast(n, &gossip.Envelope{Type: gossip.TypeLeave, Leave: &gossip.Leave{PeerID: n.id, Seq: n.seq}})
	n.up = false
}

// converged reports whether every peer that is up has adopted one epoch
// whose members are exactly the peers that are up; else why not.
func (s *sim) converged() (bool, string) {
	var up []string
	var first *node
	for _, n := range s.nodes {
		if !n.up {
			continue
		}
		up = append(up, n.id)
		if first == nil {
			first = n
			continue
		}
		if a, b := first.view.Epoch(), n.view.Epoch(); !a.Equal(b) {
			return false, fmt.Sprintf("%s has epoch %d of %d members, %s epoch %d of %d", first.id, a.Number, len(a.Order), n.id, b.Number, len(b.Order))
		}
	}
	if first == nil {
		return false, "no peer is up"
	}
	e := first.view.Epoch()
	members := slices.Sorted(slices.Values(e.Order))
	if !slices.Equal(members, up) {
		return false, fmt.Sprintf("all adopted epoch %d of %d members, but %d peers are up", e.Number, len(e.Order), len(up))
	}
	return true, ""
}

// settle runs the simulation until it converges or within has passed; it
// returns the simulated time it took.
func (s *sim) settle(t *testing.T, what string, within time.Duration) time.Duration {
	t.Helper()
	from := s.now
	for s.now.Sub(from) <= within {
		s.run(s.now.Add(checkEvery))
		if ok, _ := s.converged(); ok {
			return s.now.Sub(from)
		}
	}
	_, why := s.converged()
	t.Fatalf("%s: no convergence within %s (%.0f intervals): %s", what, within, within.Seconds()/interval.Seconds(), why)
	return 0
}

// phase is one perturbation of the cluster and the bound, in heartbeat
// intervals, on the time its views take to agree again.
type phase struct {
	name   string
	bound  int
	action func(s *sim)
}

// coordinator returns the peer that is up with the lowest ID.
func (s *sim) coordinator() *node {
	for _, n := range s.nodes {
		if n.up {
			return n
		}
	}
	return nil
}

// member returns a random peer that is up and is not the coordinator.
func (s *sim) member() *node {
	c := s.coordinator()
	for {
		n := s.nodes[s.rng.IntN(len(s.nodes))]
		if n.up && n != c {
			return n
		}
	}
}

// phases: a cold start (every peer starting within one interval), a
// member's crash, the coordinator's crash, a newcomer, a clean departure.
// A crash is noticed after the failure timeout (5 intervals).
func phases(peers int) []phase {
	return []phase{
		{"cold start", 6, func(s *sim) {
			for i := range peers {
				s.start(s.addNode(peerID(i), peers), s.now.Add(time.Duration(s.rng.Int64N(int64(interval)))))
			}
		}},
		{"member crashes", 9, func(s *sim) { s.kill(s.member()) }},
		{"coordinator crashes", 9, func(s *sim) { s.kill(s.coordinator()) }},
		{"member joins", 4, func(s *sim) {
			n := s.addNode(peerID(len(s.nodes)), len(s.nodes)+1)
			s.start(n, s.now)
		}},
		{"member leaves", 3, func(s *sim) { s.leave(s.member()) }},
	}
}

// result is one phase's figures.
type result struct {
	phase     string
	converged time.Duration
	c         counters
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// replays is how often the planner lays out the final membership again
// for its median time.
const replays = 9

// outcome is a simulation's figures: its phases', and the planner's median
// wall and CPU time over replays layouts of the final members.
type outcome struct {
	phases    []result
	members   int
	wall, cpu time.Duration
}

// simulate runs every phase on a cluster of peers; each must converge
// within its bound. It keeps to one OS thread, whose CPU time threadCPU
// reads.
func simulate(t *testing.T, peers int, seed uint64, codec string) outcome {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := newSim(seed, codec)
	s.fullLayout = peers - 2 // the phases leave at least that many peers up
	var out outcome
	for _, p := range phases(peers) {
		s.c = counters{}
		p.action(s)
		took := s.settle(t, fmt.Sprintf("%d peers, %s", peers, p.name), time.Duration(p.bound)*interval)
		out.phases = append(out.phases, result{phase: p.name, converged: took, c: s.c})
		// Two quiet intervals before the next perturbation: a converged
		// cluster proposes nothing more, but for at most one re-plan (the
		// first layout may have been made before every link was heard of).
		proposals := s.c.proposals
		s.run(s.now.Add(2 * interval))
		if n := s.c.proposals - proposals; n > 1 {
			t.Fatalf("%d peers, %s: %d epochs proposed in two quiet intervals after converging", peers, p.name, n)
		}
		s.settle(t, fmt.Sprintf("%d peers, after %s", peers, p.name), interval)
	}
	v := s.coordinator().view
	live, members := v.Live(), v.Members()
	walls, cpus := make([]time.Duration, replays), make([]time.Duration, replays)
	for i := range walls {
		c, t := threadCPU(), time.Now()
		s.planner.Plan(slices.Clone(live), members)
		walls[i], cpus[i] = time.Since(t), threadCPU()-c
	}
	out.members, out.wall, out.cpu = len(live), median(walls), median(cpus)
	return out
}

// TestControlPlaneConverges simulates clusters of -sim.peers peers (16 and
// 64 by default; 256 with -sim.peers=16,64,256) through a cold start, a
// member's and the coordinator's crash, a newcomer and a clean departure,
// with seeded delays and 1 % of deliveries lost, and checks that after
// each every live view adopts the same epoch of exactly the live peers
// within a bounded number of heartbeat intervals. It logs, per phase, the
// simulated time to converge, the messages it took, the planner's time
// per layout and the time the Service's lock is held per proposal (wall
// and CPU: on a busy machine wall time also counts waits for a core).
func TestControlPlaneConverges(t *testing.T) {
	sizes, err := parseSizes(*peersFlag)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range sizes {
		t.Run(fmt.Sprintf("peers=%d", n), func(t *testing.T) {
			o := simulate(t, n, 1, *codecFlag)
			var all counters
			t.Logf("%-20s %9s %9s %9s %9s %7s %16s %16s", "phase", "intervals", "published", "delivered",
				"proposals", "dropped", "plan_ms wall/cpu", "lock_ms wall/cpu")
			for _, r := range o.phases {
				c := r.c
				all.add(c)
				t.Logf("%-20s %9.1f %9d %9d %9d %7d %16s %16s", r.phase, r.converged.Seconds()/interval.Seconds(),
					c.published(), c.delivered, c.proposals, c.dropped, ms(c.planWall, c.planCPU), ms(c.lockWall, c.lockCPU))
			}
			t.Logf("SUMMARY peers=%d codec=%s converged_intervals=%s published=%d delivered=%d planner_ms=%s "+
				"(wall/cpu, median of %d layouts of the final %d members; in the run %s over %d layouts of >= %d) lock_held_ms=%s (median of %d proposals)",
				n, *codecFlag, intervals(o.phases), all.published(), all.delivered,
				ms([]time.Duration{o.wall}, []time.Duration{o.cpu}), replays, o.members,
				ms(all.planWall, all.planCPU), len(all.planWall), n-2, ms(all.lockWall, all.lockCPU), len(all.lockWall))
		})
	}
}

// published counts the messages published.
func (c counters) published() int { return c.heartbeats + c.proposals + c.leaves }

// add adds o's counts and times to c's.
func (c *counters) add(o counters) {
	c.heartbeats, c.proposals, c.leaves = c.heartbeats+o.heartbeats, c.proposals+o.proposals, c.leaves+o.leaves
	c.delivered, c.dropped = c.delivered+o.delivered, c.dropped+o.dropped
	c.planWall, c.planCPU = append(c.planWall, o.planWall...), append(c.planCPU, o.planCPU...)
	c.lockWall, c.lockCPU = append(c.lockWall, o.lockWall...), append(c.lockCPU, o.lockCPU...)
}

// ms formats the medians of wall and cpu in milliseconds, "wall/cpu".
func ms(wall, cpu []time.Duration) string {
	return fmt.Sprintf("%.2f/%.2f", median(wall).Seconds()*1e3, median(cpu).Seconds()*1e3)
}

// intervals lists the phases' convergence times in heartbeat intervals.
func intervals(res []result) string {
	var parts []string
	for _, r := range res {
		parts = append(parts, fmt.Sprintf("%.1f", r.converged.Seconds()/interval.Seconds()))
	}
	return strings.Join(parts, "/")
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return nil, fmt.Errorf("-sim.peers %q: %q is not a cluster size of at least 2", s, f)
		}
		out = append(out, n)
	}
	return out, nil
}
