package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"

	"github.com/p2ptrain/p2ptrain/gpu/cuda"
)

// devicesReport is what `p2ptrain devices --json` prints.
type devicesReport struct {
	// Devices lists every device found: "cpu" first, then each CUDA device.
	Devices []deviceEntry `json:"devices"`
	// CUDA says whether the CUDA driver is usable, and if not, why.
	CUDA cudaStatus `json:"cuda"`
}

// deviceEntry is one device of the report.
type deviceEntry struct {
	Spec              string `json:"spec"` // as written in config.toml's devices
	Kind              string `json:"kind"` // "cpu" or "cuda"
	Name              string `json:"name"`
	Cores             int    `json:"cores,omitempty"`
	TotalMemoryBytes  uint64 `json:"total_memory_bytes,omitempty"`
	ComputeCapability string `json:"compute_capability,omitempty"`
	Multiprocessors   int    `json:"multiprocessors,omitempty"`
}

// cudaStatus is the CUDA driver's state.
type cudaStatus struct {
	Usable        bool   `json:"usable"`
	Library       string `json:"library,omitempty"`
	DriverVersion string `json:"driver_version,omitempty"`
	// CUBLAS and NVRTC are the libraries training on the GPUs loads.
	CUBLAS string `json:"cublas,omitempty"`
	NVRTC  string `json:"nvrtc,omitempty"`
	// Reason classifies Error: library_not_found, symbol_missing,
	// driver_too_old, driver_error, no_device or unsupported_platform.
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

func cmdDevices(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("devices", stdout)
	asJSON := fs.Bool("json", false, "print the list as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var rep devicesReport
	d, err := cuda.Load()
	if err == nil {
		devs, derr := d.Devices()
		rep = buildDevicesReport(d.Path(), d.Version(), devs, derr)
		if derr == nil {
			addTrainingLibs(&rep, d.Version())
		}
	} else {
		rep = buildDevicesReport("", 0, nil, err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printDevices(stdout, rep)
	return nil
}

// buildDevicesReport assembles the report from the CUDA loader's results
// (lib and version are the driver's, when it loaded; err is why no GPU is
// usable, when none is).
func buildDevicesReport(lib string, version int, devs []cuda.DeviceInfo, err error) devicesReport {
	rep := devicesReport{Devices: []deviceEntry{{
		Spec: "cpu", Kind: "cpu", Name: cpuName(), Cores: runtime.NumCPU(),
	}}}
	rep.CUDA.Library = lib
	if version > 0 {
		rep.CUDA.DriverVersion = cuda.FormatVersion(version)
	}
	if err != nil {
		rep.CUDA.Reason, rep.CUDA.Error = cudaReason(err), err.Error()
		return rep
	}
	rep.CUDA.Usable = true
	for _, d := range devs {
		rep.Devices = append(rep.Devices, deviceEntry{
			Spec: d.Spec(), Kind: "cuda", Name: d.Name, TotalMemoryBytes: d.TotalMemory,
			ComputeCapability: d.ComputeCapability(), Multiprocessors: d.Multiprocessors,
		})
	}
	return rep
}

// addTrainingLibs loads cuBLAS and NVRTC, which training on the GPUs needs
// besides the driver, and records their paths in rep, or marks CUDA unusable
// with the reason the first of them failed.
func addTrainingLibs(rep *devicesReport, driverVersion int) {
	b, err := cuda.LoadBLAS(driverVersion)
	if err == nil {
		rep.CUDA.CUBLAS = b.Path()
		var n *cuda.NVRTC
		if n, err = cuda.LoadNVRTC(driverVersion); err == nil {
			rep.CUDA.NVRTC = n.Path()
			return
		}
	}
	rep.CUDA.Usable = false
	rep.CUDA.Reason, rep.CUDA.Error = cudaReason(err), err.Error()
}

// cudaReason classifies a loader error for the JSON report.
func cudaReason(err error) string {
	var (
		nf  *cuda.LibraryNotFoundError
		sm  *cuda.SymbolMissingError
		old *cuda.DriverTooOldError
		nd  *cuda.NoDeviceError
		up  *cuda.UnsupportedPlatformError
	)
	switch {
	case errors.As(err, &nf):
		return "library_not_found"
	case errors.As(err, &sm):
		return "symbol_missing"
	case errors.As(err, &old):
		return "driver_too_old"
	case errors.As(err, &nd):
		return "no_device"
	case errors.As(err, &up):
		return "unsupported_platform"
	}
	return "driver_error"
}

// printDevices writes the report as a table, then the CUDA driver's state.
func printDevices(w io.Writer, rep devicesReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tNAME\tMEMORY\tCOMPUTE\tCORES/SMs")
	for _, d := range rep.Devices {
		mem, cc, units := "-", "-", d.Cores
		if d.Kind == "cuda" {
			mem = fmt.Sprintf("%.1f GiB", float64(d.TotalMemoryBytes)/(1<<30))
			cc, units = d.ComputeCapability, d.Multiprocessors
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", d.Spec, d.Name, mem, cc, units)
	}
	tw.Flush()
	if rep.CUDA.Library != "" {
		fmt.Fprintf(w, "\ncuda: driver %s (%s)\n", rep.CUDA.DriverVersion, rep.CUDA.Library)
	} else {
		fmt.Fprintln(w)
	}
	if !rep.CUDA.Usable {
		fmt.Fprintf(w, "cuda: no usable GPU: %s\n", rep.CUDA.Error)
		return
	}
	fmt.Fprintf(w, "cuda: cuBLAS %s, NVRTC %s; train on them with devices = [\"cuda\"]\n", rep.CUDA.CUBLAS, rep.CUDA.NVRTC)
}

// cpuName returns the processor's model name where /proc/cpuinfo gives it,
// else the architecture.
func cpuName() string {
	f, err := os.Open("/proc/cpuinfo")
	if err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok && strings.TrimSpace(k) == "model name" {
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOARCH
}
