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

// TestLateMemberAnnouncingAForgedEpochIsSlow: a member that announces an
// epoch number no honest member can hold (past the limit, or a jump
// beyond gossip.MaxEpochJump) is not disagreeing about the ring but
// forging, and is excluded at once like a slow one. (The chaos suite's
// epoch forger, held to strikes, kept a 4-peer cluster from its first
// step for 25 s.)
func TestLateMemberAnnouncingAForgedEpochIsSlow(t *testing.T) {
	ep := gossip.Epoch{Number: 3, Order: []string{"a", "b", "c", "d"}, Coordinator: "a"}
	forged := func(n uint64, who string) gossip.Epoch {
		return gossip.Epoch{Number: n, Order: []string{who}, Coordinator: who}
	}
	members := []gossip.Member{
		{Heartbeat: gossip.Heartbeat{PeerID: "a", Epoch: ep}},
		{Heartbeat: gossip.Heartbeat{PeerID: "b", Epoch: forged(gossip.MaxEpochNumber+1, "b")}},
		{Heartbeat: gossip.Heartbeat{PeerID: "c", Epoch: forged(3+gossip.MaxEpochJump+1, "c")}},
		{Heartbeat: gossip.Heartbeat{PeerID: "d", Epoch: forged(3+gossip.MaxEpochJump, "d")}},
	}
	slow, elsewhere := lateMembers(ep, members, map[string]uint64{"a": 0})
	if !slices.Equal(slow, []string{"b", "c"}) || !slices.Equal(elsewhere, []string{"d"}) {
		t.Fatalf("slow %v, elsewhere %v; want [b c] and [d]", slow, elsewhere)
	}
}
