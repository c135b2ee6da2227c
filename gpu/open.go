package gpu

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

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

// Opener opens the devices of one kind that a parsed spec names: one for
// "kind:N", every device of the kind for a bare "kind" (Spec.All). Its
// errors should match ErrUnavailable (the device cannot be had) or
// ErrBadSpec.
type Opener func(s Spec) ([]Device, error)

var (
	openersMu sync.RWMutex
	openers   = make(map[string]Opener)
)

// RegisterOpener makes Open and OpenAll open kind's specs with open. The CUDA
// device registers itself for "cuda" from package gpu/cuda/cudadev, which a
// binary links to train on GPUs (cmd/p2ptrain does): that package imports
// this one, so this one cannot call it directly. Registering a kind twice,
// or "cpu", panics.
func RegisterOpener(kind string, open Opener) {
	openersMu.Lock()
	defer openersMu.Unlock()
	if kind == "cpu" || openers[kind] != nil || open == nil {
		panic(fmt.Sprintf("gpu: RegisterOpener(%q) twice, for cpu, or with nil", kind))
	}
	openers[kind] = open
}

func opener(kind string) Opener {
	openersMu.RLock()
	defer openersMu.RUnlock()
	return openers[kind]
}

// Open opens the device a single spec names. A bare kind opens its first
// device: "cpu" is "cpu:0", "cuda" is "cuda:0" (OpenAll opens every GPU for
// "cuda"). A CUDA spec in a binary without the CUDA device
// (gpu/cuda/cudadev) reports ErrUnavailable with the driver loader's
// findings; with it, the error when no GPU is usable wraps the loader's
// typed error (errors.As finds it, errors.Is matches cuda.ErrNoGPU).
func Open(spec string) (Device, error) {
	s, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	if s.All && opener(s.Kind) != nil {
		s.All, s.Index = false, 0
	}
	devs, err := open(spec, s)
	if err != nil {
		return nil, err
	}
	return devs[0], nil
}

// open opens what s (parsed from spec) names.
func open(spec string, s Spec) ([]Device, error) {
	if s.Kind == "cpu" {
		if s.All {
			s.Index = 0
		}
		if s.Index >= MaxCPUDevices {
			return nil, fmt.Errorf("%w: %q: cpu index %d out of range [0, %d)", ErrBadSpec, spec, s.Index, MaxCPUDevices)
		}
		return []Device{NewCPU(s.Index)}, nil
	}
	o := opener(s.Kind)
	if o == nil {
		return nil, cudaUnavailable(spec, s)
	}
	devs, err := o(s)
	if err == nil && len(devs) == 0 {
		err = fmt.Errorf("%w: %q: no device", ErrUnavailable, spec)
	}
	return devs, err
}

// cudaUnavailable explains why a CUDA spec cannot be opened in a binary
// without the CUDA device: the loader's reason no GPU is usable (wrapped, so
// errors.As finds its typed error), a device index the driver does not have,
// or what it found.
func cudaUnavailable(spec string, s Spec) error {
	const notBuilt = `CUDA support is not built into this binary (it does not link package gpu/cuda/cudadev); use "cpu"`
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

// OpenAll opens every device the specs name, in order; a bare "cuda" opens
// every GPU. An empty list opens "cpu". Duplicate devices are an error;
// every bad spec is reported.
func OpenAll(specs []string) ([]Device, error) {
	if len(specs) == 0 {
		specs = []string{"cpu"}
	}
	var errs []error
	seen := make(map[string]bool)
	devs := make([]Device, 0, len(specs))
	for _, sp := range specs {
		s, err := ParseSpec(sp)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ds, err := open(sp, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, d := range ds {
			if seen[d.Name()] {
				errs = append(errs, fmt.Errorf("%w: %q: device %s listed twice", ErrBadSpec, sp, d.Name()))
				if err := d.Close(); err != nil {
					errs = append(errs, err)
				}
				continue
			}
			seen[d.Name()] = true
			devs = append(devs, d)
		}
	}
	if len(errs) > 0 {
		// Release what opened before the error.
		if err := CloseAll(devs); err != nil {
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}
	return devs, nil
}
