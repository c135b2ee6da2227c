//go:build unix

package allreducebench

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time (user and system, all threads) this
// process has used so far, from getrusage(RUSAGE_SELF); 0 where the
// system cannot tell.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
