package nodetest

import (
	"testing"
)

// TestLoggerDropsLinesAfterCleanup: a goroutine that logs after its test's
// cleanups ran (libp2p's pubsub loop shutting down) must not make testing
// panic ("Log in goroutine after Test... has completed").
func TestLoggerDropsLinesAfterCleanup(t *testing.T) {
	var late func()
	t.Run("peer", func(t *testing.T) {
		log := Logger(t, Config())
		log.Info("during the test")
		late = func() { log.Info("after the test") }
	})
	late() // without the guard: panic: Log in goroutine after TestLoggerDropsLinesAfterCleanup/peer has completed
}
