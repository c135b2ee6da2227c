//go:build linux

package directlink

import (
	"io"
	"net"
	"os"
	"syscall"
)

// maxLowWater bounds the receive low-water mark a read asks for: the kernel
// grows the socket's receive buffer to hold it.
const maxLowWater = 512 << 10

// minLowWater is the least a read must still lack for it to set a mark:
// below it the wake-ups saved do not pay for the system calls that set
// and clear the mark, and the mark stays at the kernel's default, 1.
const minLowWater = 64 << 10

// filler reads whole buffers from a TCP connection and lets the kernel wake
// the reader only once the rest of the buffer has arrived (SO_RCVLOWAT, up
// to maxLowWater), not for every segment: a 256 KiB record at 1 Gbit/s
// otherwise takes a wake-up, a read and a trip through the scheduler for
// each burst of segments, which on hosts whose cores are busy costs more
// than the copy. Before it waits it sets the mark to what the buffer still
// lacks, so it never waits for bytes the peer has no reason to send.
type filler struct {
	c     net.Conn // for the addresses errors name
	raw   syscall.RawConn
	lowat int // the mark last set; 0: none set (the kernel's default, 1)
}

// newFiller returns a filler for c, or nil when c is not a TCP connection.
func newFiller(c net.Conn) *filler {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return &filler{c: c, raw: raw}
}

// fill reads exactly len(buf) bytes: io.EOF when the connection ended
// before the first, io.ErrUnexpectedEOF when it ended in between. A read
// deadline or a Close ends the wait with the connection's error.
func (f *filler) fill(buf []byte) error {
	n := 0
	var rerr error
	err := f.raw.Read(func(fd uintptr) bool {
		for n < len(buf) {
			m, err := syscall.Read(int(fd), buf[n:])
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				if rerr = f.mark(fd, len(buf)-n); rerr != nil {
					return true
				}
				return false // wait until readable: the mark's bytes are there
			case err != nil:
				rerr = os.NewSyscallError("read", err)
				return true
			case m == 0:
				rerr = io.ErrUnexpectedEOF
				if n == 0 {
					rerr = io.EOF
				}
				return true
			}
			n += m
		}
		return true
	})
	if err == nil {
		err = rerr
	}
	if err == nil || err == io.EOF || err == io.ErrUnexpectedEOF {
		return err
	}
	// As a read on the connection says it: which one, and what failed.
	return &net.OpError{Op: "read", Net: "tcp", Source: f.c.LocalAddr(), Addr: f.c.RemoteAddr(), Err: err}
}

// mark sets the receive low-water mark to need bytes (at most maxLowWater).
// Where the kernel refuses, the read fails rather than wait for a mark that
// may lie beyond what the peer sends.
func (f *filler) mark(fd uintptr, need int) error {
	want := min(need, maxLowWater)
	if want < minLowWater {
		want = 1
	}
	if want == f.lowat || want == 1 && f.lowat == 0 {
		return nil
	}
	if err := syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, want); err != nil {
		return os.NewSyscallError("setsockopt SO_RCVLOWAT", err)
	}
	f.lowat = want
	return nil
}
