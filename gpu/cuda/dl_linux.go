//go:build linux && (amd64 || arm64) && !nocuda

package cuda

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/ebitengine/purego"
)

// LoaderBuilt reports whether this binary has the driver loader (linux/amd64
// or linux/arm64, built without -tags nocuda). Without it Load returns an
// *UnsupportedPlatformError.
const LoaderBuilt = true

var platform = runtime.GOOS + "/" + runtime.GOARCH

// dlopen opens a shared library by path or soname.
func dlopen(path string) (uintptr, error) {
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

// dlsym returns the address of name in the library h, or an error.
func dlsym(h uintptr, name string) (uintptr, error) { return purego.Dlsym(h, name) }

// bind makes the func *fptr call the C function at addr. The func types are
// fixed in Driver, so RegisterFunc cannot panic on them.
func bind(fptr any, addr uintptr) { purego.RegisterFunc(fptr, addr) }

// mappedFile returns the file mapped at addr in this process, from
// /proc/self/maps, or "" when it cannot be told.
func mappedFile(addr uintptr) string {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if uint64(addr) >= start && uint64(addr) < end {
			return strings.Join(fields[5:], " ")
		}
	}
	return ""
}
