//go:build linux

package allreducebench

import "testing"

func TestBusyTicks(t *testing.T) {
	for _, c := range []struct {
		line string
		want int64
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"cpu  100 2 30 5000 7 4 5 6 0 0\n", 100 + 2 + 30 + 4 + 5 + 6},
		{"cpu  1 2 3 4 5 6 7 8", 1 + 2 + 3 + 6 + 7 + 8},
		{"cpu0 1 2 3 4 5 6 7 8 0 0", 0}, // a single CPU's line, not the sum
		{"cpu  1 2 3", 0},
		{"cpu  1 x 3 4 5 6 7 8", 0},
		{"", 0},
	} {
		if got := busyTicks(c.line); int64(got) != c.want {
			t.Errorf("busyTicks(%q) = %d, want %d", c.line, got, c.want)
		}
	}
	if MachineCPU() <= 0 {
		t.Error("MachineCPU() = 0 on Linux: /proc/stat unread")
	}
}
