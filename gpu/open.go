package gpu

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/p2ptrain/p2ptrain/gpu/cuda"
)

// MaxCPUDevices bounds the index of a "cpu:N" spec.
const MaxCPUDevices = 64

// Spec is a parsed device spec: a kind ("cpu", "cuda") and an index, or All
// for a bare kind.
type Spec struct {
	Kind  string
	Index int
	// All is true for a spec without an index ("cuda": every device of that kind).
	All bool
}

// String returns the spec in its canonical form.
func (s Spec) String() string {
	if s.All {
		return s.Kind
	}
	return s.Kind + ":" + strconv.Itoa(s.Index)
}

// ParseSpec parses "cpu", "cpu:N", "cuda" or "cuda:N" (case-insensitive,
// surrounding spaces ignored).
func ParseSpec(spec string) (Spec, error) {
	t := strings.ToLower(strings.TrimSpace(spec))
	kind, idx, hasIdx := strings.Cut(t, ":")
	switch kind {
	case "cpu", "cuda":
	case "":
		return Spec{}, fmt.Errorf("%w: empty spec (want \"cpu\", \"cpu:N\", \"cuda\" or \"cuda:N\")", ErrBadSpec)
	default:
		return Spec{}, fmt.Errorf("%w: %q: unknown kind %q (want \"cpu\", \"cpu:N\", \"cuda\" or \"cuda:N\")", ErrBadSpec, spec, kind)
	}
	if !hasIdx {
		return Spec{Kind: kind, All: true}, nil
	}
	n, err := strconv.Atoi(idx)
	if err != nil || n < 0 || strings.HasPrefix(idx, "+") {
		return Spec{}, fmt.Errorf("%w: %q: index %q is not a non-negative integer", ErrBadSpec, spec, idx)
	}
	return Spec{Kind: kind, Index: n}, nil
}

// Open opens the device a single spec names. A bare "cpu" is "cpu:0". CUDA
// specs report ErrUnavailable until the CUDA device is built (issue 6); the
// error gives the driver loader's reason when no GPU is usable.
func Open(spec string) (Device, error) {
	s, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	switch s.Kind {
	case "cpu":
		if s.All {
			s.Index = 0
		}
		if s.Index >= MaxCPUDevices {
			return nil, fmt.Errorf("%w: %q: cpu index %d out of range [0, %d)", ErrBadSpec, spec, s.Index, MaxCPUDevices)
		}
		return NewCPU(s.Index), nil
	case "cuda":
		return nil, cudaUnavailable(spec, s)
	}
	return nil, fmt.Errorf("%w: %q", ErrBadSpec, spec)
}

// cudaUnavailable explains why a CUDA spec cannot be opened: the loader's
// reason no GPU is usable (wrapped, so errors.As finds its typed error), a
// device index the driver does not have, or that the CUDA Device itself is
// not built yet.
func cudaUnavailable(spec string, s Spec) error {
	const notBuilt = `CUDA support is not built into this binary yet (only its driver loader, issue 6); use "cpu"`
	devs, err := cuda.Enumerate()
	if err != nil {
		return fmt.Errorf("%w: %q: no usable GPU: %w; %s", ErrUnavailable, spec, err, notBuilt)
	}
	if !s.All && s.Index >= len(devs) {
		return fmt.Errorf("%w: %q: no such GPU: the CUDA driver sees %d (cuda:0 to cuda:%d)", ErrUnavailable, spec, len(devs), len(devs)-1)
	}
	if !s.All {
		devs = devs[s.Index : s.Index+1]
	}
	found := make([]string, len(devs))
	for i, d := range devs {
		found[i] = fmt.Sprintf("%s %s (compute %s)", d.Spec(), d.Name, d.ComputeCapability())
	}
	return fmt.Errorf("%w: %q: found %s, but %s", ErrUnavailable, spec, strings.Join(found, ", "), notBuilt)
}

// OpenAll opens every device the specs name, in order. An empty list opens
// "cpu". Duplicate devices are an error; every bad spec is reported.
func OpenAll(specs []string) ([]Device, error) {
	if len(specs) == 0 {
		specs = []string{"cpu"}
	}
	var errs []error
	seen := make(map[string]bool)
	devs := make([]Device, 0, len(specs))
	for _, sp := range specs {
		d, err := Open(sp)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[d.Name()] {
			errs = append(errs, fmt.Errorf("%w: %q: device %s listed twice", ErrBadSpec, sp, d.Name()))
			continue
		}
		seen[d.Name()] = true
		devs = append(devs, d)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return devs, nil
}
