// Package ctxutil holds small helpers for context-aware waiting.
package ctxutil

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx ends, and reports whether the full d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
