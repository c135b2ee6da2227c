package node

import (
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2ptrain/p2ptrain/gossip"
)

// Status is the /status document.
type Status struct {
	PeerID  string         `json:"peer_id"`
	Name    string         `json:"name"`
	Addrs   []string       `json:"addrs"`
	Cluster string         `json:"cluster"`
	Version string         `json:"version"`
	Step    uint64         `json:"step"`
	Members []MemberStatus `json:"members"`
	Ring    RingStatus     `json:"ring"`
	// Links are this peer's latest link measurements, sorted by peer ID.
	Links []gossip.LinkFigure `json:"links"`
	// Training figures (absent when this peer does not train).
	Loss         *float64 `json:"loss"`
	Accuracy     *float64 `json:"accuracy"`
	ParamHash    string   `json:"param_hash,omitempty"`
	SamplesPerS  *float64 `json:"samples_per_s,omitempty"`
	Codec        string   `json:"codec,omitempty"`
	BytesPerStep *float64 `json:"bytes_per_step,omitempty"`
	// TrainerWaiting says why the trainer waits for a ring it can train in.
	TrainerWaiting string `json:"trainer_waiting,omitempty"`
}

// MemberStatus is one member as this peer sees it.
type MemberStatus struct {
	PeerID     string `json:"peer_id"`
	Name       string `json:"name"`
	State      string `json:"state"`
	LastSeenMS int64  `json:"last_seen_ms"`
	Step       uint64 `json:"step"`
	Version    string `json:"version"`
	// Observer marks a member that does not train and never joins a ring.
	Observer bool `json:"observer,omitempty"`
	// ExcludedForMS, when set, is how long this peer still keeps the member
	// out of ring epochs (it was blamed for failed steps), and ExcludedFor why.
	ExcludedForMS int64  `json:"excluded_for_ms,omitempty"`
	ExcludedFor   string `json:"excluded_for,omitempty"`
	// GossipScore is gossipsub's score of the member: negative after
	// messages the validator rejected; below -1000 it is graylisted.
	GossipScore float64 `json:"gossip_score"`
	// Links are the member's own link measurements as it gossips them
	// (this peer's are Status.Links).
	Links []gossip.LinkFigure `json:"links,omitempty"`
	// Conn is this peer's connection to the member: ConnDirect,
	// ConnRelayed (only through a circuit relay: its link counts as slow
	// in ring planning, plan.MarkRelayed), or absent when not connected.
	Conn string `json:"conn,omitempty"`
}

// RingStatus is the adopted ring epoch.
type RingStatus struct {
	Epoch       uint64   `json:"epoch"`
	Order       []string `json:"order"`
	Coordinator string   `json:"coordinator"`
	StartStep   uint64   `json:"start_step"`
	// Schedule and Shares are the epoch's all-reduce schedule and owner
	// shares, when the coordinator set them.
	Schedule string    `json:"schedule,omitempty"`
	Shares   []float64 `json:"shares,omitempty"`
	// LinkCodecs and FinalCodec are the epoch's per-link codecs: the
	// reduce-scatter codec from Order[k] to Order[k+1], and the all-gather's.
	LinkCodecs []string `json:"link_codecs,omitempty"`
	FinalCodec string   `json:"final_codec,omitempty"`
	// Waiting says why this peer, as coordinator, proposes no new epoch
	// although membership changed (e.g. no quorum), or why it refuses its
	// coordinator's latest epoch (it lists no quorum by this peer's count);
	// absent when nothing holds it back.
	Waiting string `json:"waiting,omitempty"`
	// EpochsRejected counts epochs this peer refused to adopt (numbers out
	// of bounds, proposers it does not follow).
	EpochsRejected uint64 `json:"epochs_rejected"`
	// MessagesRejected counts gossip messages the validator refused, and
	// MessagesRateLimited those ignored because their author sent too many.
	MessagesRejected    uint64 `json:"messages_rejected"`
	MessagesRateLimited uint64 `json:"messages_rate_limited"`
}

// Training is what a trainer reports for /status and /metrics.
type Training struct {
	Active       bool
	Loss         float64 // negative: none yet
	Accuracy     float64 // negative: none yet
	ParamHash    string
	SamplesPerS  float64
	BytesPerStep float64
	Codec        string
	Waiting      string // why the trainer waits ("": it does not)
}

// SetTraining records the trainer's latest figures.
func (n *Node) SetTraining(t Training) {
	n.mu.Lock()
	n.training = t
	n.mu.Unlock()
}

// Status returns the peer's current status.
func (n *Node) Status() Status {
	members, epoch := n.gsp.Snapshot()
	gs := n.gsp.Stats()
	n.mu.Lock()
	step, ti := n.step, n.training
	n.mu.Unlock()
	now := time.Now()
	st := Status{
		PeerID:  n.host.ID().String(),
		Name:    n.cfg.Node.Name,
		Addrs:   n.AddrStrings(),
		Cluster: n.cfg.Node.Cluster,
		Version: Version,
		Step:    step,
		Members: make([]MemberStatus, 0, len(members)),
		Ring: RingStatus{
			Epoch:       epoch.Number,
			Order:       epoch.Order,
			Coordinator: epoch.Coordinator,
			StartStep:   epoch.StartStep,
			Schedule:    epoch.Schedule,
			Shares:      epoch.Shares,
			LinkCodecs:  epoch.LinkCodecs,
			FinalCodec:  epoch.FinalCodec,
		},
		Links: n.probe.Figures(),
	}
	st.Ring.Waiting, st.Ring.EpochsRejected = gs.Waiting, gs.EpochsRejected
	st.Ring.MessagesRejected, st.Ring.MessagesRateLimited = gs.Rejected, gs.RateLimited
	if st.Links == nil {
		st.Links = []gossip.LinkFigure{}
	}
	if ti.Active {
		ptr := func(v float64) *float64 { return &v }
		if ti.Loss >= 0 {
			st.Loss = ptr(ti.Loss)
		}
		if ti.Accuracy >= 0 {
			st.Accuracy = ptr(ti.Accuracy)
		}
		st.ParamHash, st.Codec = ti.ParamHash, ti.Codec
		st.SamplesPerS, st.BytesPerStep = ptr(ti.SamplesPerS), ptr(ti.BytesPerStep)
		st.TrainerWaiting = ti.Waiting
	}
	if st.Ring.Order == nil {
		st.Ring.Order = []string{}
	}
	for _, m := range members {
		ms := MemberStatus{
			PeerID:      m.PeerID,
			Name:        m.Name,
			State:       m.State.String(),
			LastSeenMS:  now.Sub(m.LastSeen).Milliseconds(),
			Step:        m.Step,
			Version:     m.Version,
			Observer:    m.Observer,
			GossipScore: n.gsp.Score(m.PeerID),
			Links:       m.Links,
		}
		if id, err := peer.Decode(m.PeerID); err == nil && id != n.host.ID() {
			ms.Conn = connKind(n.host, id)
		}
		if !m.ExcludedUntil.IsZero() {
			ms.ExcludedForMS, ms.ExcludedFor = m.ExcludedUntil.Sub(now).Milliseconds(), m.ExcludedFor
		}
		st.Members = append(st.Members, ms)
	}
	return st
}

// AliveCount returns the number of alive members, self included.
func (n *Node) AliveCount() int {
	members, _ := n.gsp.Snapshot()
	c := 0
	for _, m := range members {
		if m.State == gossip.Alive {
			c++
		}
	}
	return c
}

// Traffic returns the bytes this peer has sent and received over libp2p
// since it started, all protocols together.
func (n *Node) Traffic() (sent, received int64) {
	t := n.bw.GetBandwidthTotals()
	return t.TotalOut, t.TotalIn
}
