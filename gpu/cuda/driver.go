package cuda

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"
)

// MinDriverVersion is the oldest driver API version accepted (CUDA 11.0, as
// cuDriverGetVersion reports it). Later parts of the CUDA device (NVRTC
// kernels, cuBLAS) may raise it.
const MinDriverVersion = 11000

// maxDevices bounds the device count believed from a driver.
const maxDevices = 1024

// Device attributes (CUdevice_attribute) read by Devices.
const (
	attrMultiprocessorCount = 16
	attrComputeMajor        = 75
	attrComputeMinor        = 76
)

// Driver is a loaded CUDA driver library on which cuInit has succeeded.
type Driver struct {
	lib     string  // the file loaded, or the soname where it could not be told
	handle  uintptr // the dlopen handle
	version int     // cuDriverGetVersion

	apiOnce sync.Once
	api     *deviceAPI // the functions a Context needs, bound on first use
	apiErr  error

	cuInit               func(flags uint32) Result
	cuDriverGetVersion   func(version *int32) Result
	cuDeviceGetCount     func(count *int32) Result
	cuDeviceGet          func(dev *int32, ordinal int32) Result
	cuDeviceGetName      func(name *byte, n int32, dev int32) Result
	cuDeviceTotalMem     func(bytes *uint64, dev int32) Result
	cuDeviceGetAttribute func(v *int32, attr int32, dev int32) Result
	cuGetErrorName       func(code Result, name **byte) Result // nil when the library lacks it
}

// symbol is one driver function to bind.
type symbol struct {
	name     string
	fptr     any // pointer to the Driver's func field
	optional bool
}

func (d *Driver) symbols() []symbol {
	return []symbol{
		{name: "cuInit", fptr: &d.cuInit},
		{name: "cuDriverGetVersion", fptr: &d.cuDriverGetVersion},
		{name: "cuDeviceGetCount", fptr: &d.cuDeviceGetCount},
		{name: "cuDeviceGet", fptr: &d.cuDeviceGet},
		{name: "cuDeviceGetName", fptr: &d.cuDeviceGetName},
		{name: "cuDeviceTotalMem_v2", fptr: &d.cuDeviceTotalMem},
		{name: "cuDeviceGetAttribute", fptr: &d.cuDeviceGetAttribute},
		{name: "cuGetErrorName", fptr: &d.cuGetErrorName, optional: true},
	}
}

// Path returns the driver library loaded: its file where it can be told,
// else the soname it was opened by.
func (d *Driver) Path() string { return d.lib }

// Version returns the driver API version (cuDriverGetVersion), e.g. 12040
// for CUDA 12.4; FormatVersion formats it.
func (d *Driver) Version() int { return d.version }

var (
	loadedMu sync.Mutex
	loaded   = make(map[string]*Driver) // by the file or soname opened
)

// Load finds, loads and initialises the CUDA driver library (see the package
// documentation for where it looks). Every error matches ErrNoGPU and is one
// of the typed errors listed there, possibly wrapped with the library's path.
func Load() (*Driver, error) { return load(osEnviron()) }

func load(env environ) (*Driver, error) {
	if !LoaderBuilt {
		return nil, &UnsupportedPlatformError{Platform: platform, NoCUDATag: builtWithoutLoader}
	}
	loadedMu.Lock()
	defer loadedMu.Unlock()
	h, opened, err := find(env, driverLib)
	if err != nil {
		return nil, err
	}
	if d := loaded[opened]; d != nil {
		return d, nil
	}
	d := &Driver{lib: opened, handle: h}
	if d.lib, err = bindSymbols(h, opened, "", d.symbols()); err != nil {
		return nil, err
	}
	var v int32
	if err := d.check("cuDriverGetVersion", d.cuDriverGetVersion(&v)); err != nil {
		return nil, fmt.Errorf("CUDA driver %s: %w", d.lib, err)
	}
	d.version = int(v)
	if d.version < MinDriverVersion {
		return nil, &DriverTooOldError{Library: d.lib, Version: d.version, Min: MinDriverVersion}
	}
	if r := d.cuInit(0); r != Success {
		if r == ErrorNoDevice {
			return nil, &NoDeviceError{Library: d.lib, Reason: "cuInit: " + d.describe(r)}
		}
		return nil, fmt.Errorf("CUDA driver %s: %w", d.lib, d.resultError("cuInit", r))
	}
	loaded[opened] = d
	return d, nil
}

// bindSymbols looks up every symbol in the library h (opened as opened) and
// binds it; a required symbol that is missing is a *SymbolMissingError
// naming component. It returns the library's file, found from the first
// symbol's address, or opened where that cannot be told.
func bindSymbols(h uintptr, opened, component string, syms []symbol) (string, error) {
	file := opened
	for i, s := range syms {
		addr, err := dlsym(h, s.name)
		if err != nil || addr == 0 {
			if s.optional {
				continue
			}
			return "", &SymbolMissingError{Component: component, Library: opened, Symbol: s.name}
		}
		if i == 0 {
			if f := mappedFile(addr); f != "" {
				file = f
			}
		}
		bind(s.fptr, addr)
	}
	return file, nil
}

// find opens the first loadable library of lib's search plan; it returns its
// handle and the path or soname it was opened by.
func find(env environ, lib libSpec) (uintptr, string, error) {
	nf := &LibraryNotFoundError{Name: lib.name}
	for _, p := range searchPlan(env, lib) {
		nf.Searched = append(nf.Searched, p.label)
		for _, f := range p.files {
			if !p.system {
				if _, err := os.Stat(f); err != nil {
					continue
				}
			}
			h, err := dlopen(f)
			if err == nil {
				return h, f, nil
			}
			if p.system && strings.Contains(err.Error(), "No such file") {
				continue // the normal miss: the linker does not know the soname
			}
			nf.Failed = append(nf.Failed, f+": "+err.Error())
		}
	}
	return 0, "", nf
}

// describe returns "NAME (code)" for a CUresult.
func (d *Driver) describe(r Result) string {
	return fmt.Sprintf("%s (%d)", d.resultName(r), int32(r))
}

// resultName names a CUresult: from the table, else from the driver's
// cuGetErrorName, else "CUresult(N)".
func (d *Driver) resultName(r Result) string {
	if _, ok := resultNames[r]; ok || d.cuGetErrorName == nil {
		return r.String()
	}
	var p *byte
	if d.cuGetErrorName(r, &p) != Success || p == nil {
		return r.String()
	}
	return cString(p, 128)
}

func (d *Driver) resultError(fn string, r Result) error {
	return &ResultError{Func: fn, Code: r, Name: d.resultName(r)}
}

// check turns a CUresult into nil or a *ResultError naming fn.
func (d *Driver) check(fn string, r Result) error {
	if r == Success {
		return nil
	}
	return d.resultError(fn, r)
}

// cString copies the NUL-terminated C string at p, reading at most max bytes.
func cString(p *byte, max int) string {
	var b []byte
	for i := 0; i < max; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// DeviceInfo describes one CUDA device.
type DeviceInfo struct {
	// Index is the device ordinal: the N of "cuda:N".
	Index int `json:"index"`
	// Name is the device's name, e.g. "NVIDIA H100 80GB HBM3".
	Name string `json:"name"`
	// TotalMemory is the device memory in bytes.
	TotalMemory uint64 `json:"total_memory_bytes"`
	// ComputeMajor and ComputeMinor are the compute capability, e.g. 9 and 0.
	ComputeMajor int `json:"compute_major"`
	ComputeMinor int `json:"compute_minor"`
	// Multiprocessors is the number of streaming multiprocessors.
	Multiprocessors int `json:"multiprocessors"`
	// DriverVersion is the driver API version, e.g. 12040 for 12.4.
	DriverVersion int `json:"driver_version"`
}

// Spec returns the device spec naming this device, e.g. "cuda:0".
func (i DeviceInfo) Spec() string { return fmt.Sprintf("cuda:%d", i.Index) }

// ComputeCapability returns the compute capability as "major.minor".
func (i DeviceInfo) ComputeCapability() string {
	return fmt.Sprintf("%d.%d", i.ComputeMajor, i.ComputeMinor)
}

// Devices returns every device the driver sees, in ordinal order. It returns
// a *NoDeviceError when there is none.
func (d *Driver) Devices() ([]DeviceInfo, error) {
	var n int32
	if err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, &NoDeviceError{Library: d.lib, Reason: "cuDeviceGetCount = 0"}
	}
	if n > maxDevices {
		return nil, fmt.Errorf("CUDA driver %s: %w", d.lib, &ResultError{Func: "cuDeviceGetCount", Code: -1,
			Name: fmt.Sprintf("implausible count %d", n)})
	}
	infos := make([]DeviceInfo, 0, n)
	var errs []error
	for i := range n {
		info, err := d.device(i)
		if err != nil {
			errs = append(errs, fmt.Errorf("cuda:%d: %w", i, err))
			continue
		}
		infos = append(infos, info)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return infos, nil
}

// device reads the properties of device ordinal i.
func (d *Driver) device(i int32) (DeviceInfo, error) {
	info := DeviceInfo{Index: int(i), DriverVersion: d.version}
	var dev int32
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, i)); err != nil {
		return info, err
	}
	var name [256]byte
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), dev)); err != nil {
		return info, err
	}
	info.Name = strings.TrimSpace(string(name[:clen(name[:])]))
	if err := d.check("cuDeviceTotalMem_v2", d.cuDeviceTotalMem(&info.TotalMemory, dev)); err != nil {
		return info, err
	}
	for _, a := range []struct {
		attr int32
		dst  *int
	}{
		{attrComputeMajor, &info.ComputeMajor},
		{attrComputeMinor, &info.ComputeMinor},
		{attrMultiprocessorCount, &info.Multiprocessors},
	} {
		var v int32
		if r := d.cuDeviceGetAttribute(&v, a.attr, dev); r != Success {
			return info, fmt.Errorf("attribute %d: %w", a.attr, d.resultError("cuDeviceGetAttribute", r))
		}
		*a.dst = int(v)
	}
	return info, nil
}

// clen returns the length of the NUL-terminated string in b.
func clen(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return len(b)
}

// Enumerate loads the driver (Load) and returns every CUDA device it sees.
// Its error says exactly why no GPU is usable and matches ErrNoGPU.
func Enumerate() ([]DeviceInfo, error) {
	d, err := Load()
	if err != nil {
		return nil, err
	}
	return d.Devices()
}

// library is a loaded library other than the driver (cuBLAS, NVRTC): the
// functions to bind, and what to do once they are bound.
type library interface {
	symbols() []symbol
	// loaded is told the library's file and finishes loading it.
	loaded(path string) error
}

// libCache loads libraries of one kind, each file once.
type libCache struct {
	mu sync.Mutex
	m  map[string]library // by the path or soname opened
}

// load finds lib with env and returns the library loaded from it: the one
// loaded before from the same file, or fresh() with its symbols bound
// (missing ones reported as component's) and loaded called.
func (c *libCache) load(env environ, lib libSpec, component string, fresh func() library) (library, error) {
	if !LoaderBuilt {
		return nil, &UnsupportedPlatformError{Platform: platform, NoCUDATag: builtWithoutLoader}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h, opened, err := find(env, lib)
	if err != nil {
		return nil, err
	}
	if l := c.m[opened]; l != nil {
		return l, nil
	}
	l := fresh()
	path, err := bindSymbols(h, opened, component, l.symbols())
	if err == nil {
		err = l.loaded(path)
	}
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = make(map[string]library)
	}
	c.m[opened] = l
	return l, nil
}
