package gossip

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Bounds on epoch numbers, so that no message can make the numbering wrap
// or run out: an epoch above MaxEpochNumber is refused, and so is one
// numbered more than MaxEpochJump above the highest the view has seen (0 at
// start: epochs are numbered one above the last, so no honest cluster gets
// near 2^20, and a forged hint at a peer's start cannot lift its numbering
// out of its ring's reach).
const (
	MaxEpochNumber uint64 = 1 << 62
	MaxEpochJump   uint64 = 1 << 20
)

// ErrEpochRejected marks an epoch a view refused to adopt (Rejection.Err).
var ErrEpochRejected = errors.New("gossip: epoch rejected")

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
	// ExcludedUntil, when not zero, is when this peer's exclusion from ring
	// epochs ends (View.Exclude); ExcludedFor says why.
	ExcludedUntil time.Time
	ExcludedFor   string
}

// Event reports a change of the view: a member's state (Member set) or a newly
// adopted epoch (Epoch set).
type Event struct {
	Member    *MemberChange
	Epoch     *Epoch
	Exclusion *ExclusionChange
}

// ExclusionChange is a member excluded from ring epochs: by the view on
// its own evidence (a forged epoch, a coordinator that proposes nothing)
// or at the trainer's request (Service.Exclude).
type ExclusionChange struct {
	Peer   string
	For    time.Duration
	Reason string
}

// MemberChange is a member moving from one state to another. A member seen for
// the first time moves from Dead.
type MemberChange struct {
	Peer     string
	From, To State
	// New marks a member this view had not known (From is Dead then).
	New bool
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
	// ExcludeFor is the first back-off of an excluded member (View.Exclude);
	// each further exclusion of the same member doubles it, up to
	// MaxExcludeDoublings doublings. 0: DefaultExcludeFor.
	ExcludeFor time.Duration
	// ProposeTimeout is how long this view waits for its coordinator to
	// propose an epoch it needs (membership changed, or a member asked for
	// one) while it counts a quorum, before it excludes the coordinator.
	// 0: twice FailAfter.
	ProposeTimeout time.Duration
}

// DefaultExcludeFor is Timing.ExcludeFor's default; MaxExcludeDoublings
// bounds how often a member's back-off doubles (16× the first at most).
const (
	DefaultExcludeFor   = 30 * time.Second
	MaxExcludeDoublings = 4
)

// exclusion is a member kept out of ring epochs for a back-off.
type exclusion struct {
	until  time.Time
	count  int // exclusions so far: the back-off doubles with each
	reason string
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
// (for example from measured link bandwidth). Service calls it on a
// goroutine of its own without its lock (Draft.Plan), one call at a time,
// while gossip goes on: implementations must be deterministic and must not
// modify the members they are given. A plan that does not make a valid
// epoch is replaced by the peer-ID order without schedule or shares.
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
	// committed is the last epoch in which the local peer completed a step
	// (Commit); the quorum of new epochs counts its members.
	committed Epoch
	// maxEpoch is the highest epoch number seen in any message.
	maxEpoch uint64
	// leftSeq remembers the Seq of departures so late heartbeats are ignored.
	leftSeq map[string]uint64
	// planner lays out proposals (nil: peer-ID order); replanEvery spaces
	// re-plans of an unchanged membership (0: none); lastReplan is the last.
	planner     Planner
	replanEvery time.Duration
	lastReplan  time.Time
	// rejected counts refused epochs; lastRejection is the latest.
	rejected      uint64
	lastRejection error
	// waiting says why the coordinator proposes nothing ("" when it may).
	waiting string
	// refusal is the latest epoch refused for want of a quorum (adoptable)
	// and why, until an epoch is adopted: its coordinator's heartbeats carry
	// it every interval, and it is counted and logged once; Waiting reports
	// it while that coordinator is this view's.
	refusal struct {
		epoch Epoch
		why   string
	}
	// excluded holds the members this peer keeps out of ring epochs (and
	// does not follow as coordinator) until their back-off ends; now is the
	// latest time the view was told, against which back-offs are judged.
	excluded map[string]*exclusion
	now      time.Time
	// excluders counts the members other than self whose latest heartbeat
	// lists members it excludes (none: exclusionVotes has nothing to count).
	excluders int
	// stalled is the coordinator this view waits on for an epoch it needs
	// and since when (zero: nothing awaited); see Tick.
	stalled struct {
		coordinator string
		since       time.Time
	}
}

// NewView returns a view whose only member is self, alive at now.
func NewView(self Heartbeat, timing Timing, now time.Time) *View {
	v := &View{
		self:     self.PeerID,
		timing:   timing,
		members:  map[string]*Member{},
		leftSeq:  map[string]uint64{},
		excluded: map[string]*exclusion{},
		now:      now,
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
	votes := v.exclusionVotes()
	for id, m := range v.members {
		c := *m
		c.ExcludedUntil, c.ExcludedFor = v.excludedWith(id, votes)
		out = append(out, c)
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
func (v *View) Live() []string { return v.live(true) }

// ringable returns the live members that may join a ring (observers may
// not), sorted.
func (v *View) ringable() []string { return v.live(false) }

// live returns the peer IDs of alive and suspect members, sorted; with
// observers false, without observers and excluded members.
func (v *View) live(observers bool) []string {
	var out []string
	var votes map[string]int
	if !observers {
		votes = v.exclusionVotes()
	}
	for id, m := range v.members {
		if m.State.inRing() && (observers || !m.Observer && !v.isExcluded(id, votes)) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// coordinates reports whether the local peer is the coordinator (the
// lowest ringable peer ID) without listing and sorting the ringable
// members: every gossip message asks, and at hundreds of members the
// answer is usually no.
func (v *View) coordinates() bool {
	votes := v.exclusionVotes()
	ringable := func(id string, m *Member) bool {
		return m.State.inRing() && !m.Observer && !v.isExcluded(id, votes)
	}
	if !ringable(v.self, v.members[v.self]) {
		return false
	}
	for id, m := range v.members {
		if id < v.self && ringable(id, m) {
			return false
		}
	}
	return true
}

// Coordinator returns the lowest peer ID among the live members that may
// join a ring.
func (v *View) Coordinator() string {
	live := v.ringable()
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
	v.advance(now)
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
	v.excluders += min(len(hb.Excluded), 1) - min(len(m.Heartbeat.Excluded), 1)
	m.Heartbeat = hb
	m.LastSeen = now
	m.State = Alive
	if from != Alive || !ok {
		ev := v.change(m, from)
		ev.Member.New = !ok
		evs = append(evs, ev)
	}
	return append(evs, v.Offer(hb.Epoch, hb.PeerID, now)...)
}

// Leave records a clean departure.
func (v *View) Leave(l Leave, now time.Time) []Event {
	if l.PeerID == v.self {
		return nil
	}
	if seq, ok := v.leftSeq[l.PeerID]; ok && l.Seq <= seq {
		return nil
	}
	m, ok := v.members[l.PeerID]
	if !ok {
		// A departure of a peer this view never knew changes nothing; recording
		// it would let fresh identities grow the view without bound.
		return nil
	}
	v.leftSeq[l.PeerID] = l.Seq
	if m.Seq > l.Seq || m.State == Left {
		return nil
	}
	from := m.State
	m.State = Left
	m.LastSeen = now
	return []Event{v.change(m, from)}
}

// Offer considers an epoch carried by a message that from signed: a
// proposal, or a copy in from's heartbeat (from is the local peer for its
// own proposals). It adopts e if e is newer than the current epoch, from is
// e's coordinator, that coordinator is one this view follows (see
// checkProposer), and e keeps a quorum by this view's own count (see
// adoptable). A copy that another member forwards is only a hint of the
// numbering. Numbers beyond the bounds (MaxEpochNumber, MaxEpochJump),
// proposals from a coordinator this view does not follow and epochs
// without a quorum are refused and counted (Rejections); a member vouching
// for a forged number of its own making is excluded too (excludeForger).
func (v *View) Offer(e Epoch, from string, now time.Time) []Event {
	v.advance(now)
	if e.Number <= v.epoch.Number && !e.newer(v.epoch) {
		// The adopted epoch or an older one, as most heartbeats carry: it
		// changes nothing (its number is within every bound), and at
		// hundreds of members validating it would cost O(n) a message.
		return nil
	}
	if e.Number == 0 || e.validate() != nil {
		return nil
	}
	if err := v.checkNumber(e.Number); err != nil {
		v.reject(from, e, err)
		return v.excludeForger(from, e)
	}
	if e.Number > v.maxEpoch {
		v.maxEpoch = e.Number
	}
	if !e.newer(v.epoch) {
		return nil
	}
	// A majority of e's members vouching for it in their own heartbeats
	// overrides this view's exclusions and its idea of the coordinator: a
	// peer whose exclusions differ from the others' would otherwise refuse
	// the ring they all train in, for as long as its back-off lasts.
	majority := v.followedByMajority(e)
	if from != e.Coordinator && !majority {
		return nil // a forwarded copy only tells the numbering
	}
	if err := v.checkProposer(e.Coordinator); err != nil {
		if !majority || !errors.Is(err, errNotFollowed) {
			v.reject(from, e, err)
			return nil
		}
		if x := v.excluded[e.Coordinator]; x != nil {
			x.until = v.now // the back-off ends; its count still doubles the next one
		}
	}
	if err := v.adoptable(e); err != nil {
		if !e.Equal(v.refusal.epoch) || err.Error() != v.refusal.why {
			v.refusal.epoch, v.refusal.why = cloneEpoch(e), err.Error()
			v.reject(from, e, err)
		}
		return nil
	}
	v.refusal.epoch, v.refusal.why = Epoch{}, ""
	v.epoch = cloneEpoch(e)
	v.stalled.since = now // the coordinator moved: its time to propose starts again
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
		ev := v.change(m, Dead)
		ev.Member.New = true
		evs = append(evs, ev)
	}
	return evs
}

// excludeForger excludes from, a member that vouched for an epoch of its
// own making (from is e's coordinator) whose number checkNumber refused.
// No honest member proposes one: Proposal stops at MaxEpochNumber, and an
// honest coordinator numbers its epochs from the ring's. A jump is held
// against it only once this view has adopted an epoch (a peer that has just
// joined may be far behind an old ring's numbering).
func (v *View) excludeForger(from string, e Epoch) []Event {
	if from != e.Coordinator || from == v.self || e.Number <= MaxEpochNumber && v.epoch.Number == 0 || v.ownExclusion(from) {
		return nil // (an excluded forger's every message would double its back-off again)
	}
	return v.excludeEvent(from, fmt.Sprintf("it proposed ring epoch %d, a number no honest member can hold", e.Number))
}

// excludeEvent excludes peer (Exclude) and returns the event saying so.
func (v *View) excludeEvent(peer, reason string) []Event {
	d := v.Exclude(peer, reason, v.now)
	if d == 0 {
		return nil
	}
	return []Event{{Exclusion: &ExclusionChange{Peer: peer, For: d, Reason: reason}}}
}

// adoptable refuses an epoch that another member proposed unless it keeps
// a quorum by this view's own count: its members must include a majority of
// the base that quorum counts, the last committed ring's members that did
// not depart cleanly and the ringable members that joined since, e's
// coordinator among them (its proposal says it trains now, even before its
// heartbeat arrives). Held are the members of that base that e lists, not
// those this view holds live: its failure detection may lag the
// proposer's, and a member missing from e is out of the ring either way.
// A newcomer that knows no ring that trained counts a quorum of anything
// it hears; the members it lists must not follow it into a minority. (Of a
// ring {A, B, C} partitioned {A, B} | {C}, a newcomer with the lowest peer
// ID on C's side proposed {N, C}, C adopted it, and both sides trained.)
// A view that never completed a step in a ring adopts without a count (it
// knows no ring that trained: counting against an epoch it adopted but
// never trained in left a newcomer refusing every ring once half of that
// epoch had died), and so are its own proposals (Proposal counted them).
func (v *View) adoptable(e Epoch) error {
	if e.Coordinator == v.self || v.committed.Number == 0 {
		return nil
	}
	live := v.ringable()
	if i, ok := slices.BinarySearch(live, e.Coordinator); !ok {
		live = slices.Insert(live, i, e.Coordinator)
	}
	q := v.count(live, e.Order)
	if q.ok() {
		return nil
	}
	return fmt.Errorf("%w: no quorum: it lists %d of %s, %d needed", ErrEpochRejected, q.have, q.members(), q.need())
}

// checkNumber refuses an epoch number that would let the numbering wrap or
// run out (CheckEpochNumber against the highest number seen, 0 before any).
func (v *View) checkNumber(n uint64) error {
	return CheckEpochNumber(n, max(v.epoch.Number, v.maxEpoch))
}

// CheckEpochNumber refuses an epoch number n that no honest member can
// announce when the highest number seen is base: above MaxEpochNumber, or
// more than MaxEpochJump above base.
func CheckEpochNumber(n, base uint64) error {
	if n > MaxEpochNumber {
		return fmt.Errorf("%w: number %d is above the limit %d", ErrEpochRejected, n, MaxEpochNumber)
	}
	if n > base && n-base > MaxEpochJump {
		return fmt.Errorf("%w: number %d jumps %d past the highest seen, %d (limit %d)", ErrEpochRejected, n, n-base, base, MaxEpochJump)
	}
	return nil
}

// checkProposer refuses an epoch whose coordinator p this view does not
// follow: a member it holds dead or departed, an excluded member (Exclude),
// or one with a higher peer ID than this view's coordinator. A lower ID it
// has not heard of yet is followed: that peer will be its coordinator once
// heard.
//
// A member this view still holds an observer is followed too: a proposal
// lists its proposer, so it says the proposer trains now, whatever its last
// heartbeat said. A peer that starts training stops being an observer, and
// its first proposal may arrive before its next heartbeat; refusing it, a
// peer proposed a ring of its own, and the two disagreed until one
// excluded the other. (An honest observer never proposes: Proposal leaves
// observers out of every ring and the coordinator's seat.)
func (v *View) checkProposer(p string) error {
	if m := v.members[p]; m != nil && p != v.self {
		if !m.State.inRing() {
			return fmt.Errorf("%w: coordinator %s is %s in this view", ErrEpochRejected, p, m.State)
		}
		if until, why := v.Excluded(p); !until.IsZero() {
			return fmt.Errorf("%w: %w: coordinator %s is excluded until %s (%s)", ErrEpochRejected, errNotFollowed, p, until.Format(time.RFC3339), why)
		}
	}
	if c := v.Coordinator(); c != "" && p > c {
		return fmt.Errorf("%w: %w: proposed by %s, but this view's coordinator is %s", ErrEpochRejected, errNotFollowed, p, c)
	}
	return nil
}

// errNotFollowed: a proposer this view would not choose as coordinator
// (excluded, or not the lowest live ID), which a majority may overrule.
var errNotFollowed = errors.New("gossip: not this view's coordinator")

// followedByMajority reports whether e is vouched for by a majority: more
// than half of the current epoch's members and more than half of e's
// members announce e itself (number and digest) in their latest
// heartbeats, counting live members other than this peer. A member alone
// cannot vouch for an epoch of its own making; with no current epoch
// nothing is vouched for.
func (v *View) followedByMajority(e Epoch) bool {
	if v.epoch.Number == 0 {
		return false
	}
	n := 0
	seen := map[string]bool{}
	for _, id := range slices.Concat(v.epoch.Order, e.Order) {
		m := v.members[id]
		if seen[id] || id == v.self || m == nil || !m.State.inRing() || m.Heartbeat.Epoch.Number != e.Number {
			continue
		}
		seen[id] = true
		// Equal content is what equal digests identify; comparing it
		// spares a JSON encoding of the epoch per member (at 256 members,
		// milliseconds per heartbeat for a peer that missed a proposal).
		if m.Heartbeat.Epoch.Equal(e) {
			n++
		}
	}
	return 2*n > len(v.epoch.Order) && 2*n > len(e.Order)
}

// Exclude keeps peer out of the ring epochs this view proposes and out of
// the coordinator's seat (its proposals are refused) for a back-off that
// starts at Timing.ExcludeFor and doubles with each exclusion of the same
// peer (MaxExcludeDoublings at most). The local peer is never excluded. It
// returns the back-off, 0 when nothing was done.
//
// Only a member this view holds live (alive or suspect) is excluded: one it
// holds dead or departed is unreachable, not misbehaving. Failure detection
// keeps it out of rings and the quorum keeps a partition from forking;
// excluding it too would outlast the partition. (Both sides of a 2+2
// partition once excluded the other, for not getting ready in an epoch
// they never received, and refused each other's rings after the heal.)
func (v *View) Exclude(peer, reason string, now time.Time) time.Duration {
	v.advance(now)
	if m := v.members[peer]; peer == v.self || m == nil || !m.State.inRing() {
		return 0
	}
	x := v.excluded[peer]
	if x == nil {
		x = &exclusion{}
		v.excluded[peer] = x
	}
	base := v.timing.ExcludeFor
	if base <= 0 {
		base = DefaultExcludeFor
	}
	d := base << min(x.count, MaxExcludeDoublings)
	x.count++
	x.until, x.reason = now.Add(d), reason
	return d
}

// Excluded returns when peer's exclusion ends and why (zero time: not
// excluded now). A member is excluded by this view's own judgement
// (Exclude) or by a majority's: more than half of the current epoch's other
// members, live, list it in their heartbeats' Excluded (this view counting
// as one when it excludes the member itself). A majority's exclusion lasts
// while the majority says so; its end is reported a failure-detection
// period ahead. Sharing it keeps a peer that never saw a member misbehave
// from following it as coordinator after the others excluded it. (A peer
// that never fetched the poisoning member's state kept following it, and
// the others, finding that peer in another ring, excluded it in turn.)
func (v *View) Excluded(peer string) (time.Time, string) {
	return v.excludedWith(peer, v.exclusionVotes())
}

// excludedWith is Excluded with the votes of exclusionVotes.
func (v *View) excludedWith(peer string, votes map[string]int) (time.Time, string) {
	if x := v.excluded[peer]; x != nil && v.ownExclusion(peer) {
		return x.until, x.reason
	}
	if n, base := v.excludedBy(peer, votes); 2*n > base {
		return v.now.Add(v.timing.FailAfter), fmt.Sprintf("excluded by %d of the %d other members of epoch %d", n, base, v.epoch.Number)
	}
	return time.Time{}, ""
}

// isExcluded reports whether peer is excluded now, given the votes of
// exclusionVotes.
func (v *View) isExcluded(peer string, votes map[string]int) bool {
	if v.ownExclusion(peer) {
		return true
	}
	if votes[peer] == 0 {
		return false
	}
	n, base := v.excludedBy(peer, votes)
	return 2*n > base
}

// ownExclusion reports whether this view's own judgement excludes peer now.
func (v *View) ownExclusion(peer string) bool {
	x := v.excluded[peer]
	return x != nil && v.now.Before(x.until)
}

// excludedBy returns how many members of the current epoch other than
// peer exclude it (votes, from exclusionVotes), out of base, the epoch's
// members other than peer.
func (v *View) excludedBy(peer string, votes map[string]int) (n, base int) {
	base = len(v.epoch.Order)
	if slices.Contains(v.epoch.Order, peer) {
		base--
	}
	return votes[peer], base
}

// exclusionVotes counts, for every peer that members of the current epoch
// exclude, how many of them other than the peer itself do: live members by
// their latest heartbeat, this view by its own judgement. It makes one
// pass over the epoch for every peer at once, so that listing the ringable
// members, which every gossip message does, costs O(n) and not O(n²).
// Nil when nobody is excluded.
func (v *View) exclusionVotes() map[string]int {
	if v.excluders == 0 && len(v.excluded) == 0 {
		return nil // nobody's heartbeat lists an exclusion, and this view made none
	}
	var votes map[string]int
	var seen map[string]bool
	for _, id := range v.epoch.Order {
		var list []string
		switch m := v.members[id]; {
		case id == v.self:
			list = v.OwnExclusions()
		case m != nil && m.State.inRing():
			list = m.Heartbeat.Excluded
		}
		if len(list) == 0 {
			continue
		}
		if votes == nil {
			votes, seen = map[string]int{}, map[string]bool{}
		}
		clear(seen)
		for _, x := range list {
			if x != id && !seen[x] {
				seen[x] = true
				votes[x]++
			}
		}
	}
	return votes
}

// OwnExclusions returns the members this view excludes now by its own
// judgement, sorted (what its heartbeats announce).
func (v *View) OwnExclusions() []string {
	var out []string
	for id := range v.excluded {
		if v.ownExclusion(id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// advance moves the view's clock forward (never back).
func (v *View) advance(now time.Time) {
	if now.After(v.now) {
		v.now = now
	}
}

func (v *View) reject(from string, e Epoch, err error) {
	v.rejected++
	v.lastRejection = fmt.Errorf("epoch %d from %s: %w", e.Number, from, err)
}

// Rejections returns how many epochs this view refused and the latest
// refusal (nil if none).
func (v *View) Rejections() (uint64, error) { return v.rejected, v.lastRejection }

// Waiting returns why this view, as coordinator, proposes no epoch although
// membership changed, or, when another member coordinates, why it refused
// that coordinator's latest epoch for want of a quorum (adoptable) while no
// epoch has been adopted since ("" when nothing holds it back).
func (v *View) Waiting() string { return v.waiting }

// Tick advances failure detection to now.
func (v *View) Tick(now time.Time) []Event {
	v.advance(now)
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
			delete(v.excluded, id)
			v.excluders -= min(len(m.Heartbeat.Excluded), 1)
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
	return append(evs, v.checkCoordinator(now)...)
}

// checkCoordinator excludes the coordinator when it has proposed nothing
// for Timing.ProposeTimeout although a new epoch is needed in a way every
// view sees alike (no epoch yet, or a live member asks for one after a
// failed step) and this view counts a quorum. A member that heartbeats
// with the lowest peer ID but never proposes would otherwise hold every
// other peer out of training for as long as it stays. A membership that
// merely looks different from here is not held against it: failure
// detection differs from view to view (a flooded coordinator once missed
// heartbeats the others got, proposed nothing they needed, and was
// excluded by all of them). Any adopted epoch, or another coordinator,
// starts the wait again. Observers need no ring and wait for nothing.
// Members the coordinator's heartbeat says it excludes are not held
// against it either: leaving them out is its job.
func (v *View) checkCoordinator(now time.Time) []Event {
	live := v.ringable()
	c := ""
	if len(live) > 0 {
		c = live[0]
	}
	if c == "" || c == v.self || v.members[v.self].Observer {
		v.stalled.coordinator = ""
		return nil
	}
	want := slices.DeleteFunc(slices.Clone(live), func(id string) bool {
		return slices.Contains(v.members[c].Excluded, id)
	})
	if !(v.epoch.Number == 0 || v.wantsNewEpoch(want)) || v.quorum(live) != nil {
		v.stalled.coordinator = ""
		return nil
	}
	if v.stalled.coordinator != c {
		v.stalled.coordinator, v.stalled.since = c, now
		return nil
	}
	timeout := v.timing.ProposeTimeout
	if timeout <= 0 {
		timeout = 2 * v.timing.FailAfter
	}
	if now.Sub(v.stalled.since) < timeout {
		return nil
	}
	v.stalled.coordinator = ""
	why := fmt.Sprintf("as coordinator it proposed no ring epoch for %s although membership changed", timeout)
	if r := v.refusal; r.epoch.Coordinator == c {
		why = fmt.Sprintf("as coordinator it proposed no ring epoch this member could adopt for %s although membership changed (it refused epoch %d: %s)",
			timeout, r.epoch.Number, strings.TrimPrefix(r.why, ErrEpochRejected.Error()+": "))
	}
	return v.excludeEvent(c, why)
}

// needsEpoch reports whether live (the ringable members, sorted) calls for
// a new epoch: none adopted yet, a different membership, or a member
// asking for one.
func (v *View) needsEpoch(live []string) bool {
	cur := slices.Clone(v.epoch.Order)
	slices.Sort(cur)
	return v.epoch.Number == 0 || !slices.Equal(cur, live) || v.wantsNewEpoch(live)
}

// Proposal returns the epoch the local peer should propose now, if it is the
// coordinator and the live set differs from the current epoch's members.
// startStep is the step at which the new ring should begin.
//
// It proposes only with a quorum: a majority of the last committed ring's
// members that have not departed cleanly and of those that joined since
// must be live, so that of two sides of a partition at most one trains on
// (a minority waits; Waiting says why; see quorum).
//
// Proposal runs the planner on the caller's goroutine; Service uses Draft,
// Draft.Plan and Complete instead, so that planning holds no lock.
func (v *View) Proposal(startStep uint64) (Epoch, bool) {
	d, ok := v.Draft(startStep, v.now, false)
	if !ok {
		return Epoch{}, false
	}
	return v.Complete(d, v.now)
}

// proposable returns the ringable members when the local peer should
// propose a membership epoch now (Proposal's conditions); it says in
// Waiting why not when only the quorum is missing.
func (v *View) proposable() ([]string, bool) {
	v.waiting = ""
	if !v.coordinates() {
		if r := v.refusal; r.why != "" && v.Coordinator() == r.epoch.Coordinator {
			v.waiting = fmt.Sprintf("refusing epoch %d of coordinator %s: %s", r.epoch.Number, r.epoch.Coordinator,
				strings.TrimPrefix(r.why, ErrEpochRejected.Error()+": "))
		}
		return nil, false
	}
	live := v.ringable()
	if len(live) == 0 || live[0] != v.self {
		return nil, false
	}
	if !v.needsEpoch(live) {
		return nil, false
	}
	if err := v.quorum(live); err != nil {
		v.waiting = err.Error()
		return nil, false
	}
	return live, true
}

// Commit records that the local peer completed a step in epoch number:
// if that is the adopted epoch, it becomes the committed ring against which
// the quorum of later proposals is counted.
func (v *View) Commit(number uint64) {
	if number != 0 && number == v.epoch.Number && v.committed.Number != number {
		v.committed = cloneEpoch(v.epoch)
	}
}

// quorum reports whether live holds a majority of the members of the last
// committed ring (the current epoch before any commit), not counting those
// that departed cleanly, together with the live members that joined since
// (not in that ring). Counting the committed ring, not the latest epoch,
// keeps a quorum from shrinking through epochs that never trained: a
// coordinator that still believes in a member across a partition may
// propose a ring with it, and a majority of that ring is not a majority of
// the ring that trained. A member that crashed keeps counting until a ring
// without it commits (were it dropped when declared dead or forgotten, each
// side of a partition would drop the other and train alone), so a newcomer
// counts as a member too: otherwise a survivor of a ring that lost half of
// its members could never go on. (One of two, the other killed, with a
// newcomer whose peer ID sorted after its own, counted 1 of 2 and proposed
// nothing, and the newcomer followed it.) live is sorted.
func (v *View) quorum(live []string) error {
	if q := v.count(live, nil); !q.ok() {
		return fmt.Errorf("no quorum: %d of %s are reachable, %d needed", q.have, q.members(), q.need())
	}
	return nil
}

// quorumCount is a count of the quorum's base (see count): base members,
// joined of them not in epoch ring (the last committed ring's number, the
// current epoch's before any commit), and have of them held.
type quorumCount struct {
	ring               uint64
	base, joined, have int
}

func (q quorumCount) need() int { return q.base/2 + 1 }

func (q quorumCount) ok() bool { return q.base == 0 || q.have >= q.need() }

// members describes the base: "the 4 members (the 3 of epoch 7, ...)".
func (q quorumCount) members() string {
	if q.joined > 0 {
		return fmt.Sprintf("the %d members (the %d of epoch %d, the last ring that trained, and %d that joined since)",
			q.base, q.base-q.joined, q.ring, q.joined)
	}
	return fmt.Sprintf("the %d members of epoch %d (the last ring that trained)", q.base, q.ring)
}

// count counts the quorum's base given live, the members this view counts
// live (sorted): the last committed ring's members (the current epoch's
// before any commit) that did not depart cleanly, and the live members that
// joined since (not in that ring). Held are, with order nil, the live
// members of the base (quorum), and otherwise the members of the base that
// order lists (adoptable). It makes no copy for quorum, which every gossip
// message asks of a coordinator.
func (v *View) count(live, order []string) quorumCount {
	ring := v.epoch
	if v.committed.Number != 0 {
		ring = v.committed
	}
	var listed []string
	if order != nil {
		listed = slices.Sorted(slices.Values(order))
	}
	has := func(ids []string, id string) bool {
		_, ok := slices.BinarySearch(ids, id)
		return ok
	}
	q := quorumCount{ring: ring.Number}
	known, knownListed := 0, 0 // members of the ring that are live, and of those listed
	for _, id := range ring.Order {
		isLive := has(live, id)
		if isLive {
			known++
			if order != nil && has(listed, id) {
				knownListed++
			}
		}
		if m := v.members[id]; m != nil && m.State == Left {
			continue
		}
		if _, left := v.leftSeq[id]; left {
			continue
		}
		q.base++
		if order == nil && isLive || order != nil && has(listed, id) {
			q.have++
		}
	}
	// Epoch orders list no member twice: the rest of live joined since.
	q.joined = len(live) - known
	q.base += q.joined
	if order == nil {
		q.have += q.joined
		return q
	}
	liveListed := 0
	for _, id := range listed {
		if has(live, id) {
			liveListed++
		}
	}
	q.have += liveListed - knownListed // the newcomers listed
	return q
}

// Replan returns the epoch the local peer should propose now, if it is the
// coordinator, the planner lays out the current members differently and
// judges that materially better, and the last re-plan is at least the
// replan interval before now. It never proposes a membership change (that is
// Proposal's job) and proposes nothing without a planner.
func (v *View) Replan(startStep uint64, now time.Time) (Epoch, bool) {
	live, ok := v.replannable(now)
	if !ok {
		return Epoch{}, false
	}
	return v.Complete(v.draft(startStep, live, true), now)
}

// replannable returns the ringable members when the local peer may
// propose a re-plan of them now (Replan's conditions short of the
// planner's judgement).
func (v *View) replannable(now time.Time) ([]string, bool) {
	if v.planner == nil || v.replanEvery <= 0 || v.epoch.Number == 0 {
		return nil, false
	}
	if !v.lastReplan.IsZero() && now.Sub(v.lastReplan) < v.replanEvery {
		return nil, false
	}
	if !v.coordinates() {
		return nil, false
	}
	live := v.ringable()
	if len(live) == 0 || live[0] != v.self {
		return nil, false
	}
	cur := slices.Clone(v.epoch.Order)
	slices.Sort(cur)
	if !slices.Equal(cur, live) {
		return nil, false // a membership change: Proposal's job
	}
	return live, true
}

// Draft is an epoch proposal in three parts, so that the expensive one
// holds no lock: View.Draft takes what planning needs from the view (under
// the lock that guards it), Draft.Plan lays the epoch out from that copy
// alone (without the lock), and View.Complete turns the layout into an
// epoch if the view still calls for it (under the lock again). The members
// it holds share their heartbeats' slices with the view, which replaces a
// heartbeat whole and never writes into one; the planner must not either.
type Draft struct {
	self      string
	startStep uint64
	// replan: a re-plan of unchanged members (Replan), not a membership
	// change (Proposal).
	replan  bool
	live    []string
	members []Member
	// epoch is the adopted epoch when drafted.
	epoch   Epoch
	planner Planner
	// Set by Plan: the layout and, for a re-plan, whether the planner
	// judged it materially better than epoch's.
	planned bool
	plan    EpochPlan
	better  bool
}

// Draft returns what the local peer should lay out and propose now: a
// membership epoch when Proposal would propose one, else, with replan, a
// re-plan when Replan's interval has passed (whether the layout is worth an
// epoch is the planner's judgement, made in Draft.Plan). It copies what the
// planner reads; the caller lays the draft out with Plan and hands it to
// Complete.
func (v *View) Draft(startStep uint64, now time.Time, replan bool) (*Draft, bool) {
	if live, ok := v.proposable(); ok {
		return v.draft(startStep, live, false), true
	}
	if !replan {
		return nil, false
	}
	live, ok := v.replannable(now)
	if !ok {
		return nil, false
	}
	return v.draft(startStep, live, true), true
}

func (v *View) draft(startStep uint64, live []string, replan bool) *Draft {
	d := &Draft{self: v.self, startStep: startStep, replan: replan, live: live, epoch: cloneEpoch(v.epoch), planner: v.planner}
	if v.planner != nil {
		d.members = v.Members()
	}
	return d
}

// Plan lays the draft out with the view's planner, falling back to the
// peer-ID order when there is none or its plan is not a valid epoch, and
// for a re-plan asks the planner whether the layout is worth an epoch. It
// reads only the draft: call it without the view's lock, on any goroutine
// (one at a time). A second call does nothing.
func (d *Draft) Plan() {
	if d.planned {
		return
	}
	d.planned = true
	d.plan = EpochPlan{Order: d.live}
	if d.planner == nil {
		return
	}
	p := d.planner.Plan(slices.Clone(d.live), d.members)
	p.Order, p.Shares, p.LinkCodecs = slices.Clone(p.Order), slices.Clone(p.Shares), slices.Clone(p.LinkCodecs)
	sorted := slices.Clone(p.Order)
	slices.Sort(sorted)
	e := Epoch{Number: 1, Order: p.Order, Coordinator: d.self, Schedule: p.Schedule, Shares: p.Shares,
		LinkCodecs: p.LinkCodecs, FinalCodec: p.FinalCodec}
	if slices.Equal(sorted, d.live) && e.validate() == nil {
		d.plan = p
	}
	if d.replan {
		d.better = !d.plan.Equal(d.epoch.Plan()) && d.planner.Replan(cloneEpoch(d.epoch), d.plan, d.members)
	}
}

// Complete returns the epoch that d, laid out (Complete calls Plan if the
// caller did not), proposes: numbered above every epoch seen by now and
// starting at the draft's step. It returns false when the planner judged a
// re-plan not worth an epoch, or when the view changed since Draft in a
// way that makes the layout stale: the local peer no longer coordinates,
// the ringable members or the adopted epoch differ, or the conditions of
// the draft (a membership change with a quorum, or the re-plan interval)
// no longer hold. The caller then drops the draft and drafts again.
// Heartbeats that only brought newer link figures do not make it stale.
func (v *View) Complete(d *Draft, now time.Time) (Epoch, bool) {
	d.Plan()
	var live []string
	var ok bool
	if d.replan {
		live, ok = v.replannable(now)
		ok = ok && d.better
	} else {
		live, ok = v.proposable()
	}
	if !ok || !slices.Equal(live, d.live) || !v.epoch.Equal(d.epoch) {
		return Epoch{}, false
	}
	e, ok := v.next(d.plan, d.startStep)
	if ok && d.replan {
		v.lastReplan = now
	}
	return e, ok
}

// next returns the epoch after every one seen, laid out by p; false when
// the numbering is exhausted (MaxEpochNumber).
func (v *View) next(p EpochPlan, startStep uint64) (Epoch, bool) {
	n := max(v.maxEpoch, v.epoch.Number)
	if n >= MaxEpochNumber {
		v.waiting = fmt.Sprintf("epoch numbers exhausted at %d", n)
		return Epoch{}, false
	}
	return Epoch{
		Number:      n + 1,
		Order:       p.Order,
		StartStep:   startStep,
		Coordinator: v.self,
		Schedule:    p.Schedule,
		Shares:      p.Shares,
		LinkCodecs:  p.LinkCodecs,
		FinalCodec:  p.FinalCodec,
	}, true
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

// FromText is the state the member changed from, as logs and events
// name it: "new" for a member this view had not known.
func (c MemberChange) FromText() string {
	if c.New {
		return "new"
	}
	return c.From.String()
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
