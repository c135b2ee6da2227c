package gossip

import (
	"strconv"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

func TestLimiterBoundsEachAuthor(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := newLimiter(4, time.Second, 8) // 4 per second, bursts of 8
	a, b := peer.ID("a"), peer.ID("b")
	for i := range 8 {
		if !l.allow(a, t0) {
			t.Fatalf("message %d of a burst of 8 refused", i+1)
		}
	}
	if l.allow(a, t0) {
		t.Fatal("a 9th message at once was allowed")
	}
	if !l.allow(b, t0) {
		t.Fatal("another author was limited by a's messages")
	}
	if !l.allow(a, t0.Add(250*time.Millisecond)) {
		t.Fatal("a token earned after 250 ms at 4/s was refused")
	}
	if l.allow(a, t0.Add(250*time.Millisecond)) {
		t.Fatal("two messages allowed for one earned token")
	}
	// Over 10 s, no more than 8 + 4·10 messages pass however fast they come.
	n := 0
	for ms := 0; ms <= 10000; ms++ {
		if l.allow(a, t0.Add(250*time.Millisecond+time.Duration(ms)*time.Millisecond)) {
			n++
		}
	}
	if n > 40+1 {
		t.Fatalf("%d messages passed in 10 s at a limit of 4/s", n)
	}
}

func TestLimiterForgetsRefilledAuthors(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := newLimiter(4, time.Second, 8)
	for i := range maxLimited {
		l.allow(peer.ID(strconv.Itoa(i)), t0)
	}
	l.allow(peer.ID("late"), t0.Add(time.Hour))
	if len(l.buckets) != 1 {
		t.Fatalf("%d authors remembered after every bucket refilled, want 1", len(l.buckets))
	}
}
