package plan

import (
	"fmt"
	"slices"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/gossip"
)

// EpochSpec is what one member runs in an adopted ring epoch: the
// all-reduce epoch, the session configuration the coordinator's layout
// implies, and this member's per-link codecs. Every member derives it from
// the same gossip.Epoch, so neighbours agree on each link's codec.
type EpochSpec struct {
	// Gossip is the adopted epoch; Gossip.ID() identifies it.
	Gossip gossip.Epoch
	// Ring is the all-reduce epoch: number, members in ring order, self.
	Ring allreduce.Ring
	// Rank is self's position in the ring (-1: not a member).
	Rank int
	// Session is the all-reduce configuration for this epoch: the
	// coordinator's schedule and shares, and the slowest measured ring edge
	// (for frame deadlines).
	Session allreduce.Config
	// LinkEdges are the ring's per-link codec specs (LinkEdges[k] encodes the
	// hop from Order[k] to Order[k+1]) and FinalCodec the all-gather's; nil
	// when every link uses the configured codec.
	LinkEdges  []string
	FinalCodec string
	// Notes are the adjustments made to the local configuration, for the log.
	Notes []string
}

// NewEpochSpec derives self's EpochSpec from ep. base is this member's
// all-reduce configuration, codec its allreduce.codec, and links the
// measured throughput between ep's members in ep.Order (LinkMatrix).
func NewEpochSpec(ep gossip.Epoch, self string, base allreduce.Config, codec string, links Matrix) EpochSpec {
	s := EpochSpec{Gossip: ep, Ring: allreduce.Ring{Number: ep.Number, Self: allreduce.PeerID(self), Digest: ep.Digest()}, Session: base}
	for _, p := range ep.Order {
		s.Ring.Peers = append(s.Ring.Peers, allreduce.PeerID(p))
	}
	s.Rank = slices.Index(ep.Order, self)
	if ep.Schedule != "" {
		sch, err := allreduce.ParseSchedule(ep.Schedule)
		switch {
		case err != nil:
			s.Notes = append(s.Notes, fmt.Sprintf("ring epoch %d names an unknown schedule %q; using allreduce.schedule", ep.Number, ep.Schedule))
		default:
			if base.Schedule != allreduce.ScheduleAuto && base.Schedule != sch {
				s.Notes = append(s.Notes, fmt.Sprintf("allreduce.schedule %q differs from the coordinator's %q; following the ring epoch", base.Schedule, ep.Schedule))
			}
			s.Session.Schedule, s.Session.Shares = sch, nil
			if sch == allreduce.ScheduleProportional {
				s.Session.Shares = slices.Clone(ep.Shares)
			}
		}
	}
	if sch := s.Session.Schedule; sch.Hierarchical() {
		if _, err := sch.Groups(len(ep.Order)); err != nil {
			s.Notes = append(s.Notes, fmt.Sprintf("schedule %q does not fit ring epoch %d; using hier (groups of about √W): %v", sch, ep.Number, err))
			s.Session.Schedule = allreduce.ScheduleHierarchical
		}
	}
	s.Session.Bandwidth = RingBandwidth(links)
	w := len(ep.Order)
	if len(ep.LinkCodecs) != w || s.Rank < 0 || w < 2 {
		return s
	}
	if _, err := allreduce.CanonicalLinkCodec(codec); err != nil {
		s.Notes = append(s.Notes, fmt.Sprintf("ring epoch %d has per-link codecs but allreduce.codec cannot use them; using it on every link: %v", ep.Number, err))
		return s
	}
	s.LinkEdges, s.FinalCodec = ep.LinkCodecs, ep.FinalCodec
	return s
}

// LinkCodecs returns, for each of buckets fusion buckets, this member's
// codecs for its two ring links (mk makes bucket b's codec of a spec), or
// nil when the epoch has none. An unusable spec drops per-link codecs for
// the whole epoch on every member alike, with a note.
func (s *EpochSpec) LinkCodecs(buckets int, mk func(bucket int, spec string) (compress.Codec, error)) []*allreduce.LinkCodecs {
	if s.LinkEdges == nil {
		return nil
	}
	out := make([]*allreduce.LinkCodecs, buckets)
	for b := range out {
		lk, err := allreduce.NewLinkCodecs(s.LinkEdges, s.FinalCodec, s.Rank, func(spec string) (compress.Codec, error) {
			return mk(b, spec)
		})
		if err != nil {
			s.Notes = append(s.Notes, fmt.Sprintf("ring epoch %d names an unusable per-link codec; using allreduce.codec on every link: %v", s.Ring.Number, err))
			return nil
		}
		out[b] = lk
	}
	return out
}

// StartCodecs prepares codecs for an epoch's first round: low-rank codecs
// restart from the shared factors, so every member of the epoch holds the
// same ones whatever epochs it was in before.
func StartCodecs(codecs []compress.Codec) {
	for _, c := range codecs {
		if lr, ok := c.(compress.LowRank); ok {
			lr.ResetShared()
		}
	}
}

// ResetCodecs clears every codec's error-feedback residuals and shared
// state: after a failed step (the retry must not add a residual twice) and
// when a member adopts someone else's state (the residuals belonged to its
// old parameters).
func ResetCodecs(codecs []compress.Codec) {
	for _, c := range codecs {
		c.Reset()
	}
}
