package train

import (
	"slices"
	"testing"

	"github.com/p2ptrain/p2ptrain/gossip"
)

// TestLateMembersOnAnotherEpochAreNotExcludedAtOnce: of the members that
// missed train.ready_timeout, one that announces the epoch itself is slow
// (excluded at once); one that announces another epoch disagrees about the
// ring (a strike only). (With 1 % packet loss a peer refused the
// coordinator's proposal, which reached it before the heartbeat saying the
// coordinator trained now, proposed its own, and was excluded for the
// whole back-off while the others trained without it.)
func TestLateMembersOnAnotherEpochAreNotExcludedAtOnce(t *testing.T) {
	ep := gossip.Epoch{Number: 3, Order: []string{"a", "b", "c", "d"}, Coordinator: "a"}
	mine := gossip.Epoch{Number: 4, Order: []string{"b", "c", "d"}, Coordinator: "b"}
	members := []gossip.Member{
		{Heartbeat: gossip.Heartbeat{PeerID: "a", Epoch: ep}},
		{Heartbeat: gossip.Heartbeat{PeerID: "b", Epoch: mine}},
		{Heartbeat: gossip.Heartbeat{PeerID: "c", Epoch: ep}},
		{Heartbeat: gossip.Heartbeat{PeerID: "d", Epoch: ep}},
	}
	ready := map[string]uint64{"a": 0, "d": 0}
	slow, elsewhere := lateMembers(ep, members, ready)
	if !slices.Equal(slow, []string{"c"}) || !slices.Equal(elsewhere, []string{"b"}) {
		t.Fatalf("slow %v, elsewhere %v; want [c] and [b]", slow, elsewhere)
	}
}
