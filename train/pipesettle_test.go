package train

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSettleContext: a newer ring epoch does not end a stage's wait for
// its pipeline's verdict; the end of the run does, with its cause.
func TestSettleContext(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sctx, stop := settleContext(ctx)
	defer stop()
	cancel(errEpochChanged)
	select {
	case <-sctx.Done():
		t.Fatal("a newer epoch ended the settling context")
	case <-time.After(20 * time.Millisecond):
	}

	run, end := context.WithCancel(context.Background())
	step, cancelStep := context.WithCancelCause(run)
	defer cancelStep(nil)
	sctx, stop = settleContext(step)
	defer stop()
	end()
	select {
	case <-sctx.Done():
		if !errors.Is(context.Cause(sctx), context.Canceled) {
			t.Fatalf("cause %v, want context.Canceled", context.Cause(sctx))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the run's end did not end the settling context")
	}
	stop()
}
