//go:build linux

package compress

import (
	"runtime"
	"syscall"
	"time"
)

// threadCPU returns the CPU time of the calling thread (the caller locks it to
// its goroutine), so benchmarks can report throughput per core even on a busy machine.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var _ = runtime.LockOSThread
