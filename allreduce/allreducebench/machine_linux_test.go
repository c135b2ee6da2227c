//go:build linux

package allreducebench

import (
	"testing"
	"time"
)

func TestBusyTicks(t *testing.T) {
	for _, c := range []struct {
		line string
		want int64
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"cpu  100 2 30 5000 7 4 5 6 0 0\n", 100 + 2 + 30 + 4 + 5},
		{"cpu  1 2 3 4 5 6 7", 1 + 2 + 3 + 6 + 7},
		{"cpu0 1 2 3 4 5 6 7 8 0 0", 0}, // a single CPU's line, not the sum
		{"cpu  1 2 3", 0},
		{"cpu  1 x 3 4 5 6 7 8", 0},
		{"", 0},
	} {
		if got := busyTicks(c.line); got != c.want {
			t.Errorf("busyTicks(%q) = %d, want %d", c.line, got, c.want)
		}
	}
	if MachineCPU() <= 0 {
		t.Error("MachineCPU() = 0 on Linux: /proc/stat unread")
	}
}

func TestTicksToDuration(t *testing.T) {
	// USER_HZ is 100: a tick is 10 ms. A machine's uptime in ticks of 64
	// CPUs over a year must not overflow.
	if got := ticksToDuration(150); got != 1500*time.Millisecond {
		t.Errorf("150 ticks = %v, want 1.5s", got)
	}
	year := int64(64 * 365 * 24 * 3600 * userHZ)
	if got := ticksToDuration(year); got != time.Duration(64*365*24)*time.Hour {
		t.Errorf("64 CPU-years of ticks = %v", got)
	}
}
