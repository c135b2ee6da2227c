package cuda

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
)

// LibraryName is the soname of the CUDA driver library.
const LibraryName = "libcuda.so.1"

// EnvLibrary names the environment variable that points at the driver
// library (a file, or a directory holding it). When set, it is the only place
// searched.
const EnvLibrary = "P2PTRAIN_CUDA_LIB"

// maxWheelDirs bounds the Python-wheel directories searched, so a machine
// with many environments does not make the search slow or its report long.
const maxWheelDirs = 16

// libSpec names one library to search for: the driver, cuBLAS or NVRTC.
type libSpec struct {
	// name is what a *LibraryNotFoundError calls it, e.g. "libcuda.so.1".
	name string
	// env is the variable that, when set, is the only place searched.
	env string
	// sonames are handed to the dynamic linker, in order.
	sonames []string
	// files are the file names tried in each directory searched, in order.
	files []string
}

// driverLib is the CUDA driver library.
var driverLib = libSpec{
	name:    LibraryName,
	env:     EnvLibrary,
	sonames: []string{LibraryName},
	files:   []string{LibraryName, "libcuda.so"},
}

// place is one step of the search: a file to dlopen by path, or the soname
// handed to the dynamic linker (system is true).
type place struct {
	label  string   // how the error report names it
	files  []string // candidate paths; for system, the soname
	system bool
}

// environ is what the search reads from the process: an environment lookup
// and a glob, replaced in tests.
type environ struct {
	getenv func(string) string
	glob   func(string) ([]string, error)
	isDir  func(string) bool
}

func osEnviron() environ {
	return environ{
		getenv: os.Getenv,
		glob:   filepath.Glob,
		isDir: func(p string) bool {
			fi, err := os.Stat(p)
			return err == nil && fi.IsDir()
		},
	}
}

// SearchDirs returns the directories searched after the system library path,
// in order, for this machine's architecture (Python-wheel directories are
// found at load time and are not included).
func SearchDirs() []string {
	triplet := "x86_64-linux-gnu"
	target := "x86_64-linux"
	if runtime.GOARCH == "arm64" {
		triplet, target = "aarch64-linux-gnu", "sbsa-linux"
	}
	return []string{
		"/usr/lib/" + triplet,
		"/usr/lib64",
		"/usr/lib",
		"/usr/local/cuda/lib64",
		"/usr/local/cuda/targets/" + target + "/lib",
		"/usr/lib/wsl/lib",
	}
}

// wheelPatterns returns the glob patterns of Python-wheel library directories
// (site-packages/nvidia/<component>/lib) under the usual prefixes.
func wheelPatterns(env environ) []string {
	var prefixes []string
	for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if p := env.getenv(v); p != "" {
			prefixes = append(prefixes, p)
		}
	}
	if h := env.getenv("HOME"); h != "" {
		prefixes = append(prefixes, filepath.Join(h, ".local"))
	}
	prefixes = append(prefixes, "/usr/local", "/usr", "/opt/conda")
	var pats []string
	for _, p := range prefixes {
		for _, sp := range []string{"site-packages", "dist-packages"} {
			pats = append(pats, filepath.Join(p, "lib", "python3*", sp, "nvidia", "*", "lib"))
		}
	}
	// Debian's system-wide dist-packages has no python3.X component.
	pats = append(pats, "/usr/lib/python3/dist-packages/nvidia/*/lib")
	return pats
}

// inDir returns the candidate files of lib in dir.
func (lib libSpec) inDir(dir string) []string {
	files := make([]string, len(lib.files))
	for i, f := range lib.files {
		files[i] = filepath.Join(dir, f)
	}
	return files
}

// searchPlan returns the places to search for lib, in order.
func searchPlan(env environ, lib libSpec) []place {
	if p := env.getenv(lib.env); p != "" {
		label := "$" + lib.env + "=" + p
		if env.isDir(p) {
			return []place{{label: label, files: lib.inDir(p)}}
		}
		return []place{{label: label, files: []string{p}}}
	}
	plan := []place{{label: "system library path", files: lib.sonames, system: true}}
	for _, d := range SearchDirs() {
		plan = append(plan, place{label: d, files: lib.inDir(d)})
	}
	seen := make(map[string]bool)
	var wheels []string
	for _, pat := range wheelPatterns(env) {
		m, _ := env.glob(pat) // the patterns are well-formed; a bad one matches nothing
		sort.Strings(m)
		for _, d := range m {
			if !seen[d] && len(wheels) < maxWheelDirs {
				seen[d] = true
				wheels = append(wheels, d)
			}
		}
	}
	for _, d := range wheels {
		plan = append(plan, place{label: d, files: lib.inDir(d)})
	}
	if len(wheels) == 0 {
		plan = append(plan, place{label: "Python wheels (no site-packages/nvidia/*/lib found)"})
	}
	return plan
}
