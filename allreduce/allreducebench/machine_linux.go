//go:build linux

package allreducebench

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/stat's counters (USER_HZ, fixed at 100 in
// Linux's ABI).
const userHZ = 100

// MachineCPU returns the busy CPU time of the whole machine since boot,
// from /proc/stat's first line: user, nice, system, irq and softirq, summed
// over every CPU (not idle or iowait, nor steal: time a hypervisor gave
// other guests); 0 where it cannot be read. Unlike ProcessCPU it counts the kernel's network work that ran
// while no process was, or in another process's time slice: on a machine
// that hosts every peer of a benchmark, what the run cost all of them.
func MachineCPU() time.Duration {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return 0
	}
	return ticksToDuration(busyTicks(line))
}

// ticksToDuration converts /proc/stat ticks to a duration.
func ticksToDuration(ticks int64) time.Duration {
	return time.Duration(ticks) * (time.Second / userHZ)
}

// busyTicks sums the busy fields of /proc/stat's "cpu" line (0 if it is not one).
func busyTicks(line string) int64 {
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system [idle iowait] irq softirq
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0
		}
		busy += n
	}
	return busy
}
