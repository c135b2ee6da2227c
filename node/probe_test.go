package node

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/plan"
	"github.com/p2ptrain/p2ptrain/protocol/probe"
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
	// b's /status carries a's gossiped figures in a's member entry (the
	// live page labels every ring link from them).
	gossiped := false
	for _, ms := range b.Status().Members {
		gossiped = gossiped || (ms.PeerID == a.ID().String() && len(ms.Links) == 1 && ms.Links[0].Peer == b.ID().String())
	}
	if !gossiped {
		t.Fatalf("b's /status members %+v lack a's link figures", b.Status().Members)
	}
	m := b.LinkMatrix([]string{a.ID().String(), b.ID().String()})
	if !(m[0][1] > 0) || !(m[1][0] > 0) {
		t.Fatalf("b's matrix %v: want both directions known (b's own or a's figure)", m)
	}
	l := a.Links()[0]
	t.Logf("background loopback figures: %.1f Mbit/s, rtt %.3f ms", l.MbitS, l.RTTMs)
}

// TestRingFollowsMeasuredLinks runs four peers whose links are injected (a
// fast ring in an order other than the peer IDs'): the coordinator re-plans
// and every peer adopts a ring of fast edges only.
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
	mbit := [][]float64{
		{0, 100, 1000, 1000},
		{100, 0, 1000, 1000},
		{1000, 1000, 0, 100},
		{1000, 1000, 100, 0},
	}
	fastRing := func(order []string) error {
		for k := range order {
			i, j := slices.Index(sorted, order[k]), slices.Index(sorted, order[(k+1)%len(order)])
			if i < 0 || j < 0 || mbit[i][j] != 1000 {
				return fmt.Errorf("order %v has the slow edge %d → %d", order, i, j)
			}
		}
		return nil
	}
	now := time.Now()
	for i, n := range nodes {
		for j, v := range mbit[i] {
			if j != i {
				n.probe.Set(probe.LinkStatus{Peer: sorted[j], MbitS: v, RTTMs: 0.2, MeasuredAt: now})
			}
		}
		n.Gossip().Beat()
	}
	eventually(t, 10*time.Second, "ring re-planned for the links", func() error {
		if err := agreeOn(nodes, ids(nodes)); err != nil {
			return err
		}
		_, ep := nodes[0].Gossip().Snapshot()
		return fastRing(ep.Order)
	})
	_, ep := nodes[0].Gossip().Snapshot()
	if ep.Schedule != "auto" || ep.Shares != nil {
		t.Fatalf("epoch %+v: want schedule auto without shares on a uniform-NIC cluster", ep)
	}
	if m := nodes[1].LinkMatrix(ep.Order); plan.RingBandwidth(m) != 1000e6/8 {
		t.Fatalf("slowest edge of the adopted ring %v bytes/s, want 125e6 (matrix %v)", plan.RingBandwidth(m), m)
	}
	st := nodes[2].Status()
	if len(st.Links) != 3 || !slices.Equal(st.Ring.Order, ep.Order) {
		t.Fatalf("/status links %+v ring %+v", st.Links, st.Ring)
	}
}
