//go:build !linux

package directlink

import (
	"errors"
	"net"
)

// filler is Linux's low-water-mark reader; elsewhere reads go through the
// connection (newFiller returns nil).
type filler struct{}

func newFiller(net.Conn) *filler { return nil }

func (*filler) fill([]byte) error {
	return errors.New("directlink: no low-water-mark reads on this system")
}
