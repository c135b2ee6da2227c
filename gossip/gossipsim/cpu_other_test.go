//go:build !linux

package gossipsim

import "time"

// threadCPU is not measured here: CPU figures read 0.
func threadCPU() time.Duration { return 0 }
