package main

import (
	"strings"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/train"
)

func TestLogLinesNeverRunIntoTheProgressLine(t *testing.T) {
	var out strings.Builder
	l := &liveLine{w: &out}
	l.Set("step 1/10")
	if _, err := l.Write([]byte("INFO first log line\n")); err != nil {
		t.Fatal(err)
	}
	l.Set("step 2/10")
	// A line written in two pieces is not split by a redraw.
	l.Write([]byte("INFO second "))
	l.Set("step 3/10")
	l.Write([]byte("log line\n"))
	const erase = "\r\033[K"
	want := erase + "step 1/10" +
		erase + "INFO first log line\n" + "step 1/10" +
		erase + "step 2/10" +
		erase + "INFO second " + "log line\n" + "step 3/10"
	if got := out.String(); got != want {
		t.Fatalf("terminal output\n%q\nwant\n%q", got, want)
	}
	if strings.Contains(out.String(), "10INFO") || strings.Contains(out.String(), "10\nINFO") {
		t.Fatal("a log line was glued onto the progress line")
	}
}

func TestETAFollowsTheRecentPace(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC)
	e := newETA(t0)
	if _, left := e.update(t0, 0, 100); left >= 0 {
		t.Fatalf("ETA before any step = %v, want unknown", left)
	}
	// 10 steps at 1 s each: 90 steps left at 1 s.
	for s := uint64(1); s <= 10; s++ {
		elapsed, left := e.update(t0.Add(time.Duration(s)*time.Second), s, 100)
		if s == 10 && (elapsed != 10*time.Second || left != 90*time.Second) {
			t.Fatalf("after 10 steps of 1 s: elapsed %v, left %v; want 10s, 1m30s", elapsed, left)
		}
	}
	// The pace halves: the estimate moves towards 0.5 s a step.
	now := t0.Add(10 * time.Second)
	for s := uint64(11); s <= 60; s++ {
		now = now.Add(time.Second / 2)
		e.update(now, s, 100)
	}
	_, left := e.update(now, 60, 100)
	if left < 20*time.Second || left > 21*time.Second {
		t.Fatalf("after 50 steps of 0.5 s, %v left for 40 steps; want about 20 s", left)
	}
	if got := clock(3723 * time.Second); got != "1:02:03" {
		t.Errorf("clock(3723 s) = %q", got)
	}
	if got := etaString(-1); got != "-" {
		t.Errorf("unknown ETA shows %q", got)
	}
}

func TestRunSummaryGivesWallTimeTrafficAndRetries(t *testing.T) {
	got := runSummary(train.Result{Step: 300, Trained: 300, Retries: 2, Resyncs: 1}, 83*time.Second+240*time.Millisecond, 3<<20, 5<<19)
	want := "summary: 300 steps in 1m23.2s, sent 3.0 MiB, received 2.5 MiB, 2 steps retried, 1 states taken over"
	if got != want {
		t.Fatalf("runSummary = %q\nwant       %q", got, want)
	}
	// A run resumed from a checkpoint counts the steps it took itself.
	got = runSummary(train.Result{Step: 1000, Resumed: 994, Trained: 6}, 1700*time.Millisecond, 0, 0)
	if want := "summary: 6 steps (994 to 1000, resumed from a checkpoint) in 1.7s"; !strings.HasPrefix(got, want) {
		t.Fatalf("runSummary = %q\nwant it to start %q", got, want)
	}
	// A peer that joined late counts what it trained itself.
	got = runSummary(train.Result{Step: 300, Trained: 93, Resyncs: 1}, 14*time.Second, 0, 0)
	if want := "summary: 93 of 300 steps trained here (the others came with a member's state) in 14s"; !strings.HasPrefix(got, want) {
		t.Fatalf("runSummary = %q\nwant it to start %q", got, want)
	}
}
