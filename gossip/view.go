package gossip

import (
	"slices"
	"time"
)

// State is a member's liveness as seen locally.
type State int

// Member states.
const (
	Alive State = iota
	Suspect
	Dead
	Left
)

// String returns the state's name as shown in /status.
func (s State) String() string {
	switch s {
	case Alive:
		return "alive"
	case Suspect:
		return "suspect"
	case Dead:
		return "dead"
	case Left:
		return "left"
	}
	return "unknown"
}

// inRing reports whether members in this state belong in a ring epoch.
func (s State) inRing() bool { return s == Alive || s == Suspect }

// Member is one peer as the local view knows it.
type Member struct {
	Heartbeat
	State    State
	LastSeen time.Time
}

// Event reports a change of the view: a member's state (Member set) or a newly
// adopted epoch (Epoch set).
type Event struct {
	Member *MemberChange
	Epoch  *Epoch
}

// MemberChange is a member moving from one state to another. A member seen for
// the first time moves from Dead.
type MemberChange struct {
	Peer     string
	From, To State
	// Addrs are the member's advertised addresses.
	Addrs []string
}

// Timing configures failure detection.
type Timing struct {
	// SuspectAfter: silence after which an alive member becomes suspect.
	SuspectAfter time.Duration
	// FailAfter: silence after which a member is dead (the failure timeout).
	FailAfter time.Duration
	// ForgetAfter: time after which a dead or departed member is dropped.
	ForgetAfter time.Duration
}

// EpochPlan is a Planner's layout of a ring epoch.
type EpochPlan struct {
	// Order is the ring order: a permutation of the live members.
	Order []string
	// Schedule, Shares, LinkCodecs and FinalCodec become the epoch's fields
	// of the same names.
	Schedule   string
	Shares     []float64
	LinkCodecs []string
	FinalCodec string
}

// Equal reports whether two plans lay out the same epoch.
func (p EpochPlan) Equal(o EpochPlan) bool {
	return slices.Equal(p.Order, o.Order) && p.Schedule == o.Schedule && slices.Equal(p.Shares, o.Shares) &&
		slices.Equal(p.LinkCodecs, o.LinkCodecs) && p.FinalCodec == o.FinalCodec
}

// Planner lays out the ring epochs the local peer proposes as coordinator
// (for example from measured link bandwidth). The View calls it while
// Service holds its lock: implementations must be deterministic, quick and
// must not block or call back into the Service. A plan that does not make a
// valid epoch is replaced by the peer-ID order without schedule or shares.
type Planner interface {
	// Plan lays out an epoch of the live members (sorted by peer ID).
	// members are every known member, sorted by peer ID; the local member
	// carries the latest heartbeat from Config.Self.
	Plan(live []string, members []Member) EpochPlan
	// Replan reports whether plan, laid out for the members of cur, is
	// materially better than cur and worth a new epoch although membership
	// did not change.
	Replan(cur Epoch, plan EpochPlan, members []Member) bool
}

// View is the membership and ring-epoch state machine. It is not safe for
// concurrent use; Service serialises access.
type View struct {
	self    string
	timing  Timing
	members map[string]*Member
	epoch   Epoch
	// maxEpoch is the highest epoch number seen in any message.
	maxEpoch uint64
	// leftSeq remembers the Seq of departures so late heartbeats are ignored.
	leftSeq map[string]uint64
	// planner lays out proposals (nil: peer-ID order); replanEvery spaces
	// re-plans of an unchanged membership (0: none); lastReplan is the last.
	planner     Planner
	replanEvery time.Duration
	lastReplan  time.Time
}

// NewView returns a view whose only member is self, alive at now.
func NewView(self Heartbeat, timing Timing, now time.Time) *View {
	v := &View{
		self:    self.PeerID,
		timing:  timing,
		members: map[string]*Member{},
		leftSeq: map[string]uint64{},
	}
	v.members[self.PeerID] = &Member{Heartbeat: self, State: Alive, LastSeen: now}
	return v
}

// SetPlanner installs the planner of proposed epochs (nil: peer-ID order,
// no schedule) and the least time between two epochs that Replan proposes
// for an unchanged membership (0: Replan never proposes).
func (v *View) SetPlanner(p Planner, replanEvery time.Duration) {
	v.planner, v.replanEvery = p, replanEvery
}

// Self returns the local peer ID.
func (v *View) Self() string { return v.self }

// Epoch returns the adopted epoch (Number 0 before any).
func (v *View) Epoch() Epoch { return v.epoch }

// Members returns a copy of every known member, sorted by peer ID.
func (v *View) Members() []Member {
	out := make([]Member, 0, len(v.members))
	for _, m := range v.members {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Member) int {
		switch {
		case a.PeerID < b.PeerID:
			return -1
		case a.PeerID > b.PeerID:
			return 1
		}
		return 0
	})
	return out
}

// Live returns the peer IDs of alive and suspect members, sorted.
func (v *View) Live() []string {
	var out []string
	for id, m := range v.members {
		if m.State.inRing() {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Coordinator returns the lowest live peer ID.
func (v *View) Coordinator() string {
	live := v.Live()
	if len(live) == 0 {
		return ""
	}
	return live[0]
}

// UpdateSelf refreshes the local member's heartbeat (step, addresses...).
func (v *View) UpdateSelf(hb Heartbeat, now time.Time) {
	m := v.members[v.self]
	m.Heartbeat = hb
	m.LastSeen = now
}

// Heartbeat records a heartbeat received at now and returns what changed.
func (v *View) Heartbeat(hb Heartbeat, now time.Time) []Event {
	if hb.PeerID == v.self {
		return nil
	}
	if seq, ok := v.leftSeq[hb.PeerID]; ok && hb.Seq <= seq {
		return nil
	}
	var evs []Event
	m, ok := v.members[hb.PeerID]
	switch {
	case !ok:
		m = &Member{State: Dead}
		v.members[hb.PeerID] = m
	case hb.Seq <= m.Seq:
		return nil
	}
	delete(v.leftSeq, hb.PeerID)
	from := m.State
	m.Heartbeat = hb
	m.LastSeen = now
	m.State = Alive
	if from != Alive || !ok {
		evs = append(evs, v.change(m, from))
	}
	return append(evs, v.Offer(hb.Epoch, now)...)
}

// Leave records a clean departure.
func (v *View) Leave(l Leave, now time.Time) []Event {
	if l.PeerID == v.self {
		return nil
	}
	if seq, ok := v.leftSeq[l.PeerID]; ok && l.Seq <= seq {
		return nil
	}
	v.leftSeq[l.PeerID] = l.Seq
	m, ok := v.members[l.PeerID]
	if !ok || m.Seq > l.Seq || m.State == Left {
		return nil
	}
	from := m.State
	m.State = Left
	m.LastSeen = now
	return []Event{v.change(m, from)}
}

// Offer considers an epoch heard from the network (a proposal or a heartbeat's
// copy) and adopts it if it is newer than the current one.
func (v *View) Offer(e Epoch, now time.Time) []Event {
	if e.Number == 0 || e.validate() != nil {
		return nil
	}
	if e.Number > v.maxEpoch {
		v.maxEpoch = e.Number
	}
	if !e.newer(v.epoch) {
		return nil
	}
	v.epoch = cloneEpoch(e)
	out := cloneEpoch(e)
	evs := []Event{{Epoch: &out}}
	// Members of the adopted epoch that this view has never heard of exist by
	// the proposer's word: count them as alive until failure detection says
	// otherwise. Without this, a peer that hasn't yet heard a lower-ID member
	// would think itself coordinator and out-propose the real one in a loop.
	for _, id := range e.Order {
		if _, ok := v.members[id]; ok || id == v.self {
			continue
		}
		if _, left := v.leftSeq[id]; left {
			continue
		}
		m := &Member{Heartbeat: Heartbeat{PeerID: id}, State: Alive, LastSeen: now}
		v.members[id] = m
		evs = append(evs, v.change(m, Dead))
	}
	return evs
}

// Tick advances failure detection to now.
func (v *View) Tick(now time.Time) []Event {
	var evs []Event
	for id, m := range v.members {
		if id == v.self {
			continue
		}
		silent := now.Sub(m.LastSeen)
		from := m.State
		switch {
		case (m.State == Dead || m.State == Left) && silent >= v.timing.ForgetAfter:
			delete(v.members, id)
			if seq, ok := v.leftSeq[id]; ok && seq < m.Seq {
				delete(v.leftSeq, id)
			}
			continue
		case m.State.inRing() && silent >= v.timing.FailAfter:
			m.State = Dead
		case m.State == Alive && silent >= v.timing.SuspectAfter:
			m.State = Suspect
		}
		if m.State != from {
			evs = append(evs, v.change(m, from))
		}
	}
	return evs
}

// Proposal returns the epoch the local peer should propose now, if it is the
// coordinator and the live set differs from the current epoch's members.
// startStep is the step at which the new ring should begin.
func (v *View) Proposal(startStep uint64) (Epoch, bool) {
	live := v.Live()
	if len(live) == 0 || live[0] != v.self {
		return Epoch{}, false
	}
	cur := slices.Clone(v.epoch.Order)
	slices.Sort(cur)
	if v.epoch.Number != 0 && slices.Equal(cur, live) && !v.wantsNewEpoch(live) {
		return Epoch{}, false
	}
	return v.next(v.plan(live), startStep), true
}

// Replan returns the epoch the local peer should propose now, if it is the
// coordinator, the planner lays out the current members differently and
// judges that materially better, and the last re-plan is at least the
// replan interval before now. It never proposes a membership change (that is
// Proposal's job) and proposes nothing without a planner.
func (v *View) Replan(startStep uint64, now time.Time) (Epoch, bool) {
	if v.planner == nil || v.replanEvery <= 0 || v.epoch.Number == 0 {
		return Epoch{}, false
	}
	if !v.lastReplan.IsZero() && now.Sub(v.lastReplan) < v.replanEvery {
		return Epoch{}, false
	}
	live := v.Live()
	if len(live) == 0 || live[0] != v.self {
		return Epoch{}, false
	}
	cur := slices.Clone(v.epoch.Order)
	slices.Sort(cur)
	if !slices.Equal(cur, live) {
		return Epoch{}, false // a membership change: Proposal's job
	}
	p := v.plan(live)
	if p.Equal(v.epoch.Plan()) {
		return Epoch{}, false
	}
	if !v.planner.Replan(cloneEpoch(v.epoch), p, v.Members()) {
		return Epoch{}, false
	}
	v.lastReplan = now
	return v.next(p, startStep), true
}

// next returns the epoch after every one seen, laid out by p.
func (v *View) next(p EpochPlan, startStep uint64) Epoch {
	return Epoch{
		Number:      max(v.maxEpoch, v.epoch.Number) + 1,
		Order:       p.Order,
		StartStep:   startStep,
		Coordinator: v.self,
		Schedule:    p.Schedule,
		Shares:      p.Shares,
		LinkCodecs:  p.LinkCodecs,
		FinalCodec:  p.FinalCodec,
	}
}

// plan lays out an epoch of live (sorted) with the planner, falling back to
// the peer-ID order when there is none or its plan is not a valid epoch.
func (v *View) plan(live []string) EpochPlan {
	fallback := EpochPlan{Order: live}
	if v.planner == nil {
		return fallback
	}
	p := v.planner.Plan(slices.Clone(live), v.Members())
	p.Order, p.Shares, p.LinkCodecs = slices.Clone(p.Order), slices.Clone(p.Shares), slices.Clone(p.LinkCodecs)
	sorted := slices.Clone(p.Order)
	slices.Sort(sorted)
	e := v.next(p, 0)
	if !slices.Equal(sorted, live) || e.validate() != nil {
		return fallback
	}
	return p
}

// wantsNewEpoch reports whether a live member asked for an epoch above the current one.
func (v *View) wantsNewEpoch(live []string) bool {
	for _, id := range live {
		if m := v.members[id]; m != nil && m.WantEpoch != 0 && m.WantEpoch >= v.epoch.Number {
			return true
		}
	}
	return false
}

func (v *View) change(m *Member, from State) Event {
	return Event{Member: &MemberChange{Peer: m.PeerID, From: from, To: m.State, Addrs: slices.Clone(m.Addrs)}}
}

func cloneEpoch(e Epoch) Epoch {
	e.Order = slices.Clone(e.Order)
	e.Shares = slices.Clone(e.Shares)
	e.LinkCodecs = slices.Clone(e.LinkCodecs)
	return e
}
