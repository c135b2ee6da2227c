//go:build !linux

package allreducebench

import "time"

// MachineCPU returns 0: the machine's busy CPU time is read on Linux only.
func MachineCPU() time.Duration { return 0 }
