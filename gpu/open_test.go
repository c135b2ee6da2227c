package gpu

import (
	"errors"
	"fmt"
	"testing"
)

// closeCounter is a device whose Close is counted.
type closeCounter struct {
	*CPU
	closed *int
}

func (c closeCounter) Close() error { *c.closed++; return nil }

// withFakeCUDA registers a "cuda" opener for the test: index 9 fails, the
// others open a counted device named cuda:N.
func withFakeCUDA(t *testing.T, opened, closed *int) {
	t.Helper()
	RegisterOpener("cuda", func(s Spec) ([]Device, error) {
		if s.Index == 9 {
			return nil, fmt.Errorf("%w: %q: no such GPU", ErrUnavailable, s.String())
		}
		*opened++
		d := NewCPU(0)
		d.name = s.String()
		return []Device{closeCounter{CPU: d, closed: closed}}, nil
	})
	t.Cleanup(func() {
		openersMu.Lock()
		delete(openers, "cuda")
		openersMu.Unlock()
	})
}

// TestOpenAllReleasesOnError: when one spec fails, or names a device twice,
// OpenAll closes every device it had already opened.
func TestOpenAllReleasesOnError(t *testing.T) {
	for _, specs := range [][]string{
		{"cuda:0", "cuda:1", "cuda:9"},
		{"cuda:0", "cuda:0"},
		{"cuda:0", "bogus"},
	} {
		t.Run(fmt.Sprint(specs), func(t *testing.T) {
			var opened, closed int
			withFakeCUDA(t, &opened, &closed)
			devs, err := OpenAll(specs)
			if err == nil {
				t.Fatalf("OpenAll(%q) = %v, want an error", specs, devs)
			}
			if opened == 0 || closed != opened {
				t.Errorf("OpenAll(%q): opened %d devices, closed %d (err %v)", specs, opened, closed, err)
			}
		})
	}
}

// TestCloseAllJoinsErrors: CloseAll closes every device even when one fails,
// and names the one that failed.
func TestCloseAllJoinsErrors(t *testing.T) {
	var closed int
	bad := failingClose{CPU: NewCPU(1)}
	err := CloseAll([]Device{closeCounter{CPU: NewCPU(0), closed: &closed}, bad, closeCounter{CPU: NewCPU(2), closed: &closed}})
	if closed != 2 || err == nil || !errors.Is(err, errCloseFailed) {
		t.Fatalf("closed %d, err %v; want 2 closed and the failure reported", closed, err)
	}
}

var errCloseFailed = errors.New("close failed")

type failingClose struct{ *CPU }

func (failingClose) Close() error { return errCloseFailed }
