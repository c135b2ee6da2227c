//go:build linux

package directlink

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// lowWater reads c's SO_RCVLOWAT.
func lowWater(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	return v
}

// waitQueued polls until c's receive queue holds n bytes.
func waitQueued(t *testing.T, c *net.TCPConn, n int) {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var q int
		var qerr error
		if err := raw.Control(func(fd uintptr) { q, qerr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || qerr != nil {
			t.Fatal(err, qerr)
		}
		if q >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitLowWater polls c's mark until it is want (a deadline, not a sleep:
// the reader sets it just before it waits).
func waitLowWater(t *testing.T, c *net.TCPConn, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for lowWater(t, c) != want {
		if time.Now().After(deadline) {
			t.Fatalf("SO_RCVLOWAT is %d, want %d", lowWater(t, c), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// A read waits for the rest of a large buffer with the mark set to what it
// lacks, and a small read after it lowers the mark again before it waits:
// a mark left high would wait for bytes the peer never sends.
func TestFillerMarksWhatTheReadLacks(t *testing.T) {
	w, r := tcpPair(t)
	f := newFiller(r)
	if f == nil {
		t.Fatal("no filler for a TCP connection")
	}
	if err := r.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 300<<10/16)
	got := make([]byte, len(big))
	// The first 100 KiB are queued before the read starts, so its first
	// read takes them all and it then waits for the other 200.
	if _, err := w.Write(big[:100<<10]); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, r, 100<<10)
	done := make(chan error, 1)
	go func() { done <- f.fill(got) }()
	waitLowWater(t, r, 200<<10)
	if _, err := w.Write(big[100<<10:]); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || !bytes.Equal(got, big) {
		t.Fatalf("fill: %v (equal %v)", err, bytes.Equal(got, big))
	}

	// A small read: it must lower the mark before it waits. The test only
	// writes once the reader waits, so it waits for certain.
	small := make([]byte, 10)
	go func() { done <- f.fill(small) }()
	waitLowWater(t, r, 1)
	if _, err := w.Write([]byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || string(small) != "0123456789" {
		t.Fatalf("small fill: %v %q", err, small)
	}
}

func TestFillerEnds(t *testing.T) {
	w, r := tcpPair(t)
	f := newFiller(r)
	if _, err := w.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	buf := make([]byte, 5)
	if err := f.fill(buf); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("ended after 3 of 5 bytes: %v, want io.ErrUnexpectedEOF", err)
	}
	if err := f.fill(buf); err != io.EOF {
		t.Errorf("ended before any byte: %v, want io.EOF", err)
	}

	_, r2 := tcpPair(t)
	f2 := newFiller(r2)
	if err := r2.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	err := f2.fill(make([]byte, 100<<10))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("past the read deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	if err != nil && !strings.Contains(err.Error(), r2.RemoteAddr().String()) {
		t.Errorf("the error %q does not name the connection's peer %s", err, r2.RemoteAddr())
	}
}
