//go:build !(linux && (amd64 || arm64))

package cuda

import (
	"errors"
	"runtime"
)

const loaderSupported = false

var platform = runtime.GOOS + "/" + runtime.GOARCH

var errNoLoader = errors.New("cuda: no dynamic loader on " + platform)

func dlopen(string) (uintptr, error)         { return 0, errNoLoader }
func dlsym(uintptr, string) (uintptr, error) { return 0, errNoLoader }
func bind(any, uintptr)                      {}
func mappedFile(uintptr) string              { return "" }
