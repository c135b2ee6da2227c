//go:build !unix

package allreducebench

import "time"

// ProcessCPU returns 0: this system's process CPU time is not read.
func ProcessCPU() time.Duration { return 0 }
