package plan

import (
	"maps"
	"slices"

	"github.com/p2ptrain/p2ptrain/gossip"
)

// RelayedShare is the part of a relayed link's measured throughput that
// the planner counts. A relay forwards every byte of the link in and out
// over its own network link, which all of its relayed links share, and a
// probe measures one link at a time; halving the figure puts a relayed
// link 3 planStep steps below a direct link of the same measured speed, so
// the ring search prefers direct edges and EdgeCodec compresses the relayed
// ones it must keep (a slowdown of 2 is above SlowLink).
const RelayedShare = 0.5

// MarkRelayed returns this peer's link figures as its heartbeat should
// report them, given the peers it reaches only through a relay (relayed,
// by peer ID): each relayed link's throughput times RelayedShare; a relayed
// link not measured yet takes RelayedShare of the slowest measured link, so
// that it does not count as a typical link (unmeasured pairs otherwise take
// the median). links is not modified.
func MarkRelayed(links []gossip.LinkFigure, relayed map[string]bool) []gossip.LinkFigure {
	if len(relayed) == 0 {
		return links
	}
	out := slices.Clone(links)
	slowest := 0.0
	for i, l := range out {
		if l.MbitS > 0 && (slowest == 0 || l.MbitS < slowest) {
			slowest = l.MbitS
		}
		if relayed[l.Peer] {
			out[i].MbitS *= RelayedShare
		}
	}
	if slowest == 0 {
		return out
	}
	for _, id := range slices.Sorted(maps.Keys(relayed)) {
		if !slices.ContainsFunc(out, func(l gossip.LinkFigure) bool { return l.Peer == id }) {
			out = append(out, gossip.LinkFigure{Peer: id, MbitS: slowest * RelayedShare})
		}
	}
	return out
}
