//go:build !linux

package compress

import "time"

// threadCPU is unavailable here; benchmarks then skip their per-core metric.
func threadCPU() time.Duration { return 0 }
