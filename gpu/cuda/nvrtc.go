package cuda

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"unsafe"
)

// EnvNVRTC names the environment variable that points at the NVRTC library
// (a file, or a directory holding it); when set it is the only place searched.
const EnvNVRTC = "P2PTRAIN_NVRTC_LIB"

// nvrtcLib is the NVRTC library a driver of version driverVersion can use.
// CUDA 11.2 and later 11.x releases share the soname libnvrtc.so.11.2.
func nvrtcLib(driverVersion int) libSpec {
	lib := libSpec{env: EnvNVRTC}
	for _, m := range libMajors(driverVersion) {
		if m == 11 {
			lib.sonames = append(lib.sonames, "libnvrtc.so.11.2", "libnvrtc.so.11.1", "libnvrtc.so.11.0")
			continue
		}
		lib.sonames = append(lib.sonames, "libnvrtc.so."+strconv.Itoa(m))
	}
	lib.files = append(append([]string(nil), lib.sonames...), "libnvrtc.so")
	lib.name = lib.sonames[0]
	return lib
}

// NVRTC is a loaded NVRTC (run-time CUDA C compiler) library.
type NVRTC struct {
	lib          string
	major, minor int

	nvrtcVersion              func(major, minor *int32) int32
	nvrtcGetErrorString       func(r int32) *byte
	nvrtcCreateProgram        func(p *uintptr, src string, name string, nh int32, headers, names unsafe.Pointer) int32
	nvrtcDestroyProgram       func(p *uintptr) int32
	nvrtcCompileProgram       func(p uintptr, n int32, opts unsafe.Pointer) int32
	nvrtcGetPTXSize           func(p uintptr, n *uint64) int32
	nvrtcGetPTX               func(p uintptr, out *byte) int32
	nvrtcGetProgramLogSize    func(p uintptr, n *uint64) int32
	nvrtcGetProgramLog        func(p uintptr, out *byte) int32
	nvrtcGetCUBINSize         func(p uintptr, n *uint64) int32 // nil before NVRTC 11.1
	nvrtcGetCUBIN             func(p uintptr, out *byte) int32
	nvrtcGetNumSupportedArchs func(n *int32) int32 // nil before NVRTC 11.2
	nvrtcGetSupportedArchs    func(archs *int32) int32
}

func (n *NVRTC) symbols() []symbol {
	return []symbol{
		{name: "nvrtcVersion", fptr: &n.nvrtcVersion},
		{name: "nvrtcGetErrorString", fptr: &n.nvrtcGetErrorString},
		{name: "nvrtcCreateProgram", fptr: &n.nvrtcCreateProgram},
		{name: "nvrtcDestroyProgram", fptr: &n.nvrtcDestroyProgram},
		{name: "nvrtcCompileProgram", fptr: &n.nvrtcCompileProgram},
		{name: "nvrtcGetPTXSize", fptr: &n.nvrtcGetPTXSize},
		{name: "nvrtcGetPTX", fptr: &n.nvrtcGetPTX},
		{name: "nvrtcGetProgramLogSize", fptr: &n.nvrtcGetProgramLogSize},
		{name: "nvrtcGetProgramLog", fptr: &n.nvrtcGetProgramLog},
		{name: "nvrtcGetCUBINSize", fptr: &n.nvrtcGetCUBINSize, optional: true},
		{name: "nvrtcGetCUBIN", fptr: &n.nvrtcGetCUBIN, optional: true},
		{name: "nvrtcGetNumSupportedArchs", fptr: &n.nvrtcGetNumSupportedArchs, optional: true},
		{name: "nvrtcGetSupportedArchs", fptr: &n.nvrtcGetSupportedArchs, optional: true},
	}
}

// nvrtcCache holds the NVRTC libraries loaded, by the path opened.
var nvrtcCache libCache

// LoadNVRTC finds and loads NVRTC (searched like the driver:
// $P2PTRAIN_NVRTC_LIB, the system library path, SearchDirs, the Python
// wheels' site-packages/nvidia/cuda_nvrtc/lib), preferring the sonames of
// the CUDA major versions a driver of version driverVersion runs. Its
// errors match ErrNoGPU: *LibraryNotFoundError, *SymbolMissingError or
// *StatusError.
func LoadNVRTC(driverVersion int) (*NVRTC, error) {
	l, err := nvrtcCache.load(osEnviron(), nvrtcLib(driverVersion), "NVRTC", func() library { return &NVRTC{} })
	if err != nil {
		return nil, err
	}
	return l.(*NVRTC), nil
}

// loaded records the library's path, drops optional functions that came
// without their partner, and reads the version.
func (n *NVRTC) loaded(path string) error {
	n.lib = path
	if n.nvrtcGetCUBINSize == nil || n.nvrtcGetCUBIN == nil {
		n.nvrtcGetCUBINSize, n.nvrtcGetCUBIN = nil, nil
	}
	if n.nvrtcGetNumSupportedArchs == nil || n.nvrtcGetSupportedArchs == nil {
		n.nvrtcGetNumSupportedArchs, n.nvrtcGetSupportedArchs = nil, nil
	}
	var major, minor int32
	if err := n.check("nvrtcVersion", n.nvrtcVersion(&major, &minor)); err != nil {
		return err
	}
	n.major, n.minor = int(major), int(minor)
	return nil
}

// Path returns the NVRTC library loaded.
func (n *NVRTC) Path() string { return n.lib }

// Version returns NVRTC's version as "major.minor".
func (n *NVRTC) Version() string { return fmt.Sprintf("%d.%d", n.major, n.minor) }

func (n *NVRTC) resultName(r int32) string {
	if p := n.nvrtcGetErrorString(r); p != nil {
		return cString(p, 128)
	}
	return "nvrtcResult(" + strconv.Itoa(int(r)) + ")"
}

func (n *NVRTC) check(fn string, r int32) error {
	if r == 0 {
		return nil
	}
	return &StatusError{Component: "NVRTC", Func: fn, Code: int(r), Name: n.resultName(r)}
}

// SupportedArchs returns the SM architectures NVRTC compiles for (e.g. 75,
// 80, 86, 90), ascending, or nil when this NVRTC (before 11.2) cannot say.
func (n *NVRTC) SupportedArchs() []int {
	if n.nvrtcGetNumSupportedArchs == nil {
		return nil
	}
	var cnt int32
	if n.nvrtcGetNumSupportedArchs(&cnt) != 0 || cnt <= 0 || cnt > 1024 {
		return nil
	}
	a := make([]int32, cnt)
	if n.nvrtcGetSupportedArchs(&a[0]) != 0 {
		return nil
	}
	out := make([]int, cnt)
	for i, v := range a {
		out[i] = int(v)
	}
	slices.Sort(out)
	return out
}

// HasCUBIN reports whether this NVRTC (11.1 or later) can emit cubins.
func (n *NVRTC) HasCUBIN() bool { return n.nvrtcGetCUBIN != nil }

// Target is what the kernels are compiled to: machine code for one SM
// architecture (a cubin, loaded as it is), or PTX for a virtual
// architecture, which the driver compiles for the device when it loads it.
type Target struct {
	// Arch is the architecture as major·10+minor, e.g. 90.
	Arch int
	// CUBIN selects a cubin for sm_Arch; otherwise PTX for compute_Arch.
	CUBIN bool
}

// String returns "sm_90" or "compute_90".
func (t Target) String() string {
	if t.CUBIN {
		return "sm_" + strconv.Itoa(t.Arch)
	}
	return "compute_" + strconv.Itoa(t.Arch)
}

// ChooseTarget picks the compile target for a device of compute capability
// cc (major·10+minor) given the architectures NVRTC supports (nil: unknown)
// and whether it emits cubins. A cubin is preferred where NVRTC knows the
// exact architecture: it needs no JIT and, unlike PTX, loads on a driver
// older than the NVRTC. Otherwise PTX for the newest supported architecture
// not above cc, which the driver JIT-compiles for the device.
func ChooseTarget(cc int, supported []int, cubin bool) Target {
	if len(supported) == 0 {
		return Target{Arch: cc, CUBIN: cubin}
	}
	if slices.Contains(supported, cc) {
		return Target{Arch: cc, CUBIN: cubin}
	}
	best := supported[0]
	for _, a := range supported {
		if a <= cc {
			best = a
		}
	}
	return Target{Arch: best}
}

// Compile compiles CUDA C source for target t with the extra options opts
// and returns the PTX or cubin. A source NVRTC rejects gives a
// *CompileError carrying NVRTC's log.
func (n *NVRTC) Compile(src, name string, t Target, opts []string) ([]byte, error) {
	if t.CUBIN && !n.HasCUBIN() {
		return nil, fmt.Errorf("NVRTC %s (%s) cannot emit cubins", n.lib, n.Version())
	}
	all := append([]string{"--gpu-architecture=" + t.String()}, opts...)
	var prog uintptr
	if err := n.check("nvrtcCreateProgram", n.nvrtcCreateProgram(&prog, src, name, 0, nil, nil)); err != nil {
		return nil, err
	}
	defer n.nvrtcDestroyProgram(&prog)
	cstrs := make([][]byte, len(all))
	ptrs := make([]*byte, len(all))
	for i, o := range all {
		cstrs[i] = append([]byte(o), 0)
		ptrs[i] = &cstrs[i][0]
	}
	r := n.nvrtcCompileProgram(prog, int32(len(ptrs)), unsafe.Pointer(&ptrs[0]))
	runtime.KeepAlive(cstrs)
	runtime.KeepAlive(ptrs)
	if r != 0 {
		return nil, &CompileError{Library: n.lib, Options: all, Code: int(r), Name: n.resultName(r), Log: n.log(prog)}
	}
	size, get, what := n.nvrtcGetPTXSize, n.nvrtcGetPTX, "nvrtcGetPTX"
	if t.CUBIN {
		size, get, what = n.nvrtcGetCUBINSize, n.nvrtcGetCUBIN, "nvrtcGetCUBIN"
	}
	var sz uint64
	if err := n.check(what+"Size", size(prog, &sz)); err != nil {
		return nil, err
	}
	if sz == 0 || sz > 1<<30 {
		return nil, &StatusError{Component: "NVRTC", Func: what + "Size", Code: -1, Name: fmt.Sprintf("implausible size %d", sz)}
	}
	out := make([]byte, sz)
	if err := n.check(what, get(prog, &out[0])); err != nil {
		return nil, err
	}
	return out, nil
}

// log returns a program's compile log.
func (n *NVRTC) log(prog uintptr) string {
	var sz uint64
	if n.nvrtcGetProgramLogSize(prog, &sz) != 0 || sz == 0 || sz > 16<<20 {
		return ""
	}
	b := make([]byte, sz)
	if n.nvrtcGetProgramLog(prog, &b[0]) != 0 {
		return ""
	}
	return string(b[:clen(b)])
}
