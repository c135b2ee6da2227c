package allreduce

import (
	"math"
	"testing"
	"time"
)

// TestFrameTimeoutBounded: the derived frame deadline stays within the
// floor and TimeoutCeiling whatever bandwidth figure it is given (a member
// gossiping a tiny link speed once stretched every deadline to days).
func TestFrameTimeoutBounded(t *testing.T) {
	const bucket = 25 << 20
	for _, tc := range []struct {
		bw   float64
		want time.Duration
	}{
		{1e-9, TimeoutCeiling},
		{1, TimeoutCeiling},
		{math.Inf(1), DefaultTimeoutFloor},
		{math.NaN(), DefaultTimeoutFloor},
		{0, DefaultTimeoutFloor},
		{125e6, DefaultTimeoutFloor}, // 1 Gbit/s: 1.7 s of slack-scaled transfer
		{1.25e6, time.Duration(4 * 2 * bucket / 1.25e6 * float64(time.Second))}, // 10 Mbit/s: 168 s
	} {
		c := Config{Bandwidth: tc.bw, TimeoutFloor: DefaultTimeoutFloor}
		if got := c.frameTimeout(bucket); got != tc.want {
			t.Errorf("bandwidth %v B/s: deadline %v, want %v", tc.bw, got, tc.want)
		}
	}
}
