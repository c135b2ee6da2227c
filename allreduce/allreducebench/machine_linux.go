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
// from /proc/stat's first line: user, nice, system, irq, softirq and steal
// (everything but idle and iowait), summed over every CPU; 0 where it cannot
// be read. Unlike ProcessCPU it counts the kernel's network work that ran
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
	return busyTicks(line) * time.Second / userHZ
}

// busyTicks sums the busy fields of /proc/stat's "cpu" line (0 if it is not one).
func busyTicks(line string) time.Duration {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy time.Duration
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system [idle iowait] irq softirq steal
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0
		}
		busy += time.Duration(n)
	}
	return busy
}
