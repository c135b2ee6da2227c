package gossip

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/internal/p2ptest"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawPeer starts a Service on one loopback host and, on another, a bare
// gossipsub member of the same topic that publishes whatever a test makes it.
// The Service has the lower peer ID (it coordinates); planner, when not
// nil, lays out its proposals.
func rawPeer(t *testing.T, cluster string, planner Planner) (*Service, *pubsub.Topic, peer.ID) {
	t.Helper()
	a, b := p2ptest.Pair(t)
	if b.ID().String() < a.ID().String() {
		a, b = b, a
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// An hour's interval: no rate-limit token is earned back during a test.
	s, err := New(ctx, a, Config{Cluster: cluster, Interval: time.Hour, Timing: DefaultTiming(time.Hour, 2*time.Hour),
		Self: func() Heartbeat { return Heartbeat{Name: "a", Version: "test"} }, Planner: planner}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ps, err := pubsub.NewGossipSub(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join(Topic(cluster))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := topic.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Cancel)
	waitFor(t, 10*time.Second, "both peers see each other on the topic", func() bool {
		return len(topic.ListPeers()) > 0 && len(s.topic.ListPeers()) > 0
	})
	// gossipsub may drop what is published before its streams are up:
	// publish heartbeats until one arrives (it takes one rate-limit token).
	deadline := time.Now().Add(10 * time.Second)
	for seq := uint64(1); s.Stats().In == 0; seq++ {
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat of the raw peer arrived within 10s")
		}
		if err := topic.Publish(ctx, heartbeatOf(t, b.ID(), cluster, seq)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return s, topic, b.ID()
}

// heartbeatOf returns the encoded heartbeat of peer p with sequence number seq.
func heartbeatOf(t *testing.T, p peer.ID, cluster string, seq uint64) []byte {
	t.Helper()
	return namedHeartbeat(t, p, cluster, "raw", seq)
}

// namedHeartbeat returns the encoded heartbeat of peer p named name.
func namedHeartbeat(t *testing.T, p peer.ID, cluster, name string, seq uint64) []byte {
	t.Helper()
	hb := Heartbeat{PeerID: p.String(), Name: name, Version: "test", Seq: seq}
	m, err := Encode(&Envelope{V: WireVersion, Cluster: cluster, Type: TypeHeartbeat, Heartbeat: &hb})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// publishEach publishes every message and waits until the service has
// looked at it (counted by seen).
func publishEach(t *testing.T, topic *pubsub.Topic, msgs [][]byte, seen func() uint64) {
	t.Helper()
	for i, m := range msgs {
		if err := topic.Publish(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, fmt.Sprintf("message %d looked at", i+1), func() bool { return seen() >= uint64(i+1) })
	}
}

// TestFloodsAreRateLimited: a member that publishes well-formed messages
// far faster than any honest peer has only a burst of them processed; the
// rest are ignored (not forwarded) and counted.
func TestFloodsAreRateLimited(t *testing.T) {
	s, topic, b := rawPeer(t, "flood", nil)
	const sent = 3 * rateBurst // after the one heartbeat rawPeer sent
	msgs := make([][]byte, sent)
	for i := range msgs {
		msgs[i] = heartbeatOf(t, b, "flood", uint64(1000+i))
	}
	publishEach(t, topic, msgs, func() uint64 { st := s.Stats(); return st.In - 1 + st.RateLimited })
	if st := s.Stats(); st.In != rateBurst || st.RateLimited != sent+1-rateBurst || st.Rejected != 0 {
		t.Fatalf("%d accepted, %d rate-limited, %d rejected of %d; want %d, %d, 0", st.In, st.RateLimited, st.Rejected, sent+1, rateBurst, sent+1-rateBurst)
	}
}

// TestInvalidSendersAreScoredDown: a member that publishes malformed
// messages has each one rejected, and its gossipsub score falls below the
// graylist threshold after eleven of them (each costs -10 times their count squared), after which gossipsub drops
// everything it sends.
func TestInvalidSendersAreScoredDown(t *testing.T) {
	s, topic, b := rawPeer(t, "invalid", nil)
	msgs := make([][]byte, 11)
	for i := range msgs {
		msgs[i] = []byte("not a gossip message")
	}
	publishEach(t, topic, msgs, func() uint64 { return s.Stats().Rejected })
	waitFor(t, 10*time.Second, "the sender's score below the graylist threshold", func() bool {
		return s.Score(b.String()) < graylistThreshold
	})
}

// blockingPlanner lays out epochs in peer-ID order, but its first Plan
// call blocks until the test closes release (or, so that a failing test
// ends, until a deadline passes: timedOut says so).
type blockingPlanner struct {
	entered  chan struct{}
	release  chan struct{}
	calls    atomic.Int32
	timedOut atomic.Bool
}

func (p *blockingPlanner) Plan(live []string, _ []Member) EpochPlan {
	if p.calls.Add(1) == 1 {
		close(p.entered)
		select {
		case <-p.release:
		case <-time.After(20 * time.Second):
			p.timedOut.Store(true)
		}
	}
	return EpochPlan{Order: live}
}

func (p *blockingPlanner) Replan(Epoch, EpochPlan, []Member) bool { return false }

// TestPlannerRunsOutsideTheLock: while the planner lays out a proposal,
// the Service still takes gossip messages into its view and answers
// Snapshot and Stats, so planning holds neither the Service's lock nor its
// message loop; the layout is proposed once the planner returns. (The
// planner used to run under the lock, and the raw peer's first heartbeat
// kept the Service, and this test's setup, waiting on it.)
func TestPlannerRunsOutsideTheLock(t *testing.T) {
	p := &blockingPlanner{entered: make(chan struct{}), release: make(chan struct{})}
	defer func() {
		select {
		case <-p.release:
		default:
			close(p.release)
		}
	}()
	s, topic, b := rawPeer(t, "unlocked", p)
	select {
	case <-p.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the raw peer's heartbeat started no layout within 10s")
	}
	if p.timedOut.Load() {
		t.Fatal("the Service waited for the blocked planner: it plans under its lock")
	}
	if err := topic.Publish(context.Background(), namedHeartbeat(t, b, "unlocked", "while-planning", 1<<40)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the heartbeat sent while planning is in the view", func() bool {
		members, _ := s.Snapshot()
		return slices.ContainsFunc(members, func(m Member) bool { return m.PeerID == b.String() && m.Name == "while-planning" })
	})
	if p.timedOut.Load() {
		t.Fatal("the heartbeat was handled only after the planner gave up: planning blocks gossip")
	}
	close(p.release)
	waitFor(t, 10*time.Second, "the laid-out epoch adopted", func() bool {
		_, e := s.Snapshot()
		return e.Number == 1 && slices.Equal(e.Order, []string{s.self.String(), b.String()})
	})
}
