package memtransport

import (
	"testing"
	"time"
)

// TestPacerIgnoresLateWakeUps: a sender that wakes 1 ms after each frame is
// through still gets the full rate; after an idle gap longer than
// pacerSlack the link starts afresh.
func TestPacerIgnoresLateWakeUps(t *testing.T) {
	const n, frames = 1 << 20, 100
	p := &pacer{rate: 100 << 20, slack: pacerSlack} // 100 frames/s: 10 ms a frame
	t0 := time.Unix(1000, 0)
	now := t0
	var done time.Time
	for range frames {
		done = p.reserve(now, n)
		now = done.Add(time.Millisecond) // the sender's late wake-up
	}
	// The idle link's first frame starts pacerSlack early, the rest back to back.
	if want := t0.Add(-pacerSlack + frames*10*time.Millisecond); !done.Equal(want) {
		t.Fatalf("%d frames through at %v, want %v (late wake-ups must not add up)", frames, done.Sub(t0), want.Sub(t0))
	}
	idle := done.Add(time.Second)
	if got, want := p.reserve(idle, n), idle.Add(-pacerSlack+10*time.Millisecond); !got.Equal(want) {
		t.Fatalf("after an idle second the frame is through at %v, want %v", got.Sub(idle), want.Sub(idle))
	}
}

// TestExactPacerGivesNoBurst: without slack (Options.Exact) a frame handed
// to an idle interface starts when it is handed over, and one handed to a
// busy interface when the previous one ends.
func TestExactPacerGivesNoBurst(t *testing.T) {
	p := &pacer{rate: 100 << 20} // 10 ms a frame
	t0 := time.Unix(1000, 0)
	if got, want := p.reserve(t0, 1<<20), t0.Add(10*time.Millisecond); !got.Equal(want) {
		t.Fatalf("idle interface: through at %v, want %v", got.Sub(t0), want.Sub(t0))
	}
	if got, want := p.reserve(t0.Add(time.Millisecond), 1<<20), t0.Add(20*time.Millisecond); !got.Equal(want) {
		t.Fatalf("busy interface: through at %v, want %v", got.Sub(t0), want.Sub(t0))
	}
	idle := t0.Add(time.Second)
	if got, want := p.reserve(idle, 1<<20), idle.Add(10*time.Millisecond); !got.Equal(want) {
		t.Fatalf("after an idle second: through at %v, want %v (no burst)", got.Sub(idle), want.Sub(idle))
	}
	n := New(Options{Exact: true})
	n.SetShape("a", Shape{Up: 1})
	if s := n.shapes["a"]; s.up.slack != 0 || s.down.slack != 0 {
		t.Fatalf("an exact network's pacers have slack %v and %v", s.up.slack, s.down.slack)
	}
}
