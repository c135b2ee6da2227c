//go:build nocuda || !(linux && (amd64 || arm64))

package cuda

import (
	"errors"
	"runtime"
)

// LoaderBuilt reports whether this binary has the driver loader (linux/amd64
// or linux/arm64, built without -tags nocuda). Without it Load returns an
// *UnsupportedPlatformError.
const LoaderBuilt = false

var platform = runtime.GOOS + "/" + runtime.GOARCH

var errNoLoader = errors.New("cuda: no dynamic loader on " + platform)

func dlopen(string) (uintptr, error)         { return 0, errNoLoader }
func dlsym(uintptr, string) (uintptr, error) { return 0, errNoLoader }
func bind(any, uintptr)                      {}
func mappedFile(uintptr) string              { return "" }
