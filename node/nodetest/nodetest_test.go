package nodetest

import (
	"fmt"
	"strings"
	"testing"
)

// recordingTB is a testing.TB that keeps its log lines and cleanups.
type recordingTB struct {
	testing.TB // nil: only the methods below are called
	lines      []string
	cleanups   []func()
}

func (r *recordingTB) Logf(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}
func (r *recordingTB) Errorf(format string, args ...any) {
	r.lines = append(r.lines, "ERROR "+fmt.Sprintf(format, args...))
}
func (r *recordingTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recordingTB) Helper()          {}
func (r *recordingTB) Name() string     { return "recording" }

// TestLoggerDropsLinesAfterCleanup: a goroutine that logs after its test's
// cleanups ran (libp2p's pubsub loop shutting down) must not reach the
// test: testing panics on a log after the test completed ("Log in
// goroutine after ... has completed").
func TestLoggerDropsLinesAfterCleanup(t *testing.T) {
	tb := &recordingTB{}
	log := Logger(tb, Config())
	log.Info("during the test")
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
	log.Info("after the test")
	got := strings.Join(tb.lines, "\n")
	if !strings.Contains(got, "during the test") || strings.Contains(got, "after the test") {
		t.Fatalf("logged:\n%s\nwant the line logged during the test only", got)
	}
}
