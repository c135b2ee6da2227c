package directlink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

var loopback = net.IPv4(127, 0, 0, 1)

// link returns both ends of a direct link over loopback.
func link(t *testing.T, maxFrame int) (*Writer, *Reader) {
	t.Helper()
	l, err := Listen(loopback)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := acceptAsync(ctx, l, maxFrame)
	w, err := Dial(ctx, loopback, l.Offer())
	if err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	t.Cleanup(func() { w.Close(); a.r.Close() })
	return w, a.r
}

func alloc(n int) []byte { return make([]byte, n) }

// accepted is what Accept returned.
type accepted struct {
	r   *Reader
	err error
}

// acceptAsync runs l.Accept on a goroutine of its own; its result comes on
// the channel.
func acceptAsync(ctx context.Context, l *Listener, maxFrame int) <-chan accepted {
	got := make(chan accepted, 1)
	go func() {
		r, err := l.Accept(ctx, maxFrame)
		got <- accepted{r, err}
	}()
	return got
}

// TestFramesCrossInOrder: frames of every size, the empty one included,
// arrive whole and in order, and each is opened into the buffer alloc gave.
func TestFramesCrossInOrder(t *testing.T) {
	w, r := link(t, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	var frames [][]byte
	for _, n := range []int{0, 1, 15, 16, 17, 4096, 65535, 65536, 1 << 20} {
		f := make([]byte, n)
		for i := range f {
			f[i] = byte(rng.Uint32())
		}
		frames = append(frames, f)
	}
	go func() {
		for _, f := range frames {
			if err := w.WriteFrame(f); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i, want := range frames {
		var given []byte
		got, err := r.ReadFrameInto(func(n int) []byte { given = make([]byte, n); return given })
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d (%d bytes) arrived changed", i, len(want))
		}
		if len(want) > 0 && &got[0] != &given[0] {
			t.Fatalf("frame %d was not opened into the buffer alloc returned", i)
		}
	}
}

// TestFramesOpenInPlace: a buffer with Overhead bytes of spare capacity
// is read into and opened in place, so the reader keeps no buffer of its
// own; one without falls back to the reader's.
func TestFramesOpenInPlace(t *testing.T) {
	w, r := link(t, 1<<20)
	want := bytes.Repeat([]byte{3}, 1<<20)
	go func() {
		for range 2 {
			if err := w.WriteFrame(want); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var given []byte
	got, err := r.ReadFrameInto(func(n int) []byte { given = make([]byte, n, n+Overhead); return given })
	if err != nil || !bytes.Equal(got, want) || &got[0] != &given[0] {
		t.Fatalf("in place: %d bytes, %v (the buffer alloc gave: %v)", len(got), err, len(got) > 0 && &got[0] == &given[0])
	}
	if r.buf != nil {
		t.Fatalf("the reader grew a buffer of %d bytes for a frame it opened in place", cap(r.buf))
	}
	got, err = r.ReadFrameInto(alloc)
	if err != nil || !bytes.Equal(got, want) || cap(r.buf) < len(want)+Overhead {
		t.Fatalf("without spare capacity: %d bytes, %v, reader buffer %d", len(got), err, cap(r.buf))
	}
}

// sealedRecords returns a key and the records of frames sealed under it,
// as a Writer would send them, for tampering.
func sealedRecords(t testing.TB, frames ...[]byte) (key []byte, wire []byte) {
	t.Helper()
	key = bytes.Repeat([]byte{7}, KeySize)
	aead, err := newAEAD(key)
	if err != nil {
		t.Fatal(err)
	}
	s := sealer{aead: aead}
	for _, f := range frames {
		var ad [4]byte
		binary.LittleEndian.PutUint32(ad[:], uint32(len(f)))
		wire = append(wire, ad[:]...)
		wire = aead.Seal(wire, s.next(), f, ad[:])
	}
	return key, wire
}

// readerOver returns a Reader of key over a connection that delivers wire.
func readerOver(t *testing.T, key, wire []byte, maxFrame int) *Reader {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: loopback})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return
		}
		_, _ = c.Write(wire)
		c.Close()
	}()
	c, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	aead, err := newAEAD(key)
	if err != nil {
		t.Fatal(err)
	}
	r := &Reader{c: c, open: sealer{aead: aead}, max: maxFrame}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestTamperedRecordsDoNotOpen: a flipped bit in a record, its length, a
// replayed record, two swapped records and a truncated record are errors,
// never frames.
func TestTamperedRecordsDoNotOpen(t *testing.T) {
	a, b := []byte("first frame"), []byte("second frame!")
	key, wire := sealedRecords(t, a, b)
	first := 4 + len(a) + 16
	cases := map[string][]byte{
		"bit flipped in the ciphertext": func() []byte { w := bytes.Clone(wire); w[first+6] ^= 1; return w }(),
		"bit flipped in the tag":        func() []byte { w := bytes.Clone(wire); w[len(wire)-1] ^= 0x80; return w }(),
		"record replayed":               append(bytes.Clone(wire[:first]), wire[:first]...),
		"records swapped":               append(bytes.Clone(wire[first:]), wire[:first]...),
		"record truncated":              bytes.Clone(wire[:len(wire)-3]),
		"length changed": func() []byte {
			w := bytes.Clone(wire)
			binary.LittleEndian.PutUint32(w[first:], uint32(len(b)-1))
			return w
		}(),
	}
	for name, w := range cases {
		t.Run(name, func(t *testing.T) {
			r := readerOver(t, key, w, 1<<10)
			var err error
			var got [][]byte
			for err == nil {
				var f []byte
				if f, err = r.ReadFrameInto(alloc); err == nil {
					got = append(got, f)
				}
			}
			if errors.Is(err, io.EOF) {
				t.Fatal("the stream ended cleanly")
			}
			for i, f := range got {
				if want := [][]byte{a, b}[i]; i > 1 || !bytes.Equal(f, want) {
					t.Fatalf("frame %d = %q: a tampered record opened", i, f)
				}
			}
			if len(got) == 2 {
				t.Fatalf("both frames opened; err %v", err)
			}
		})
	}
}

// TestOversizedRecordRefusedBeforeAlloc: a length above the maximum is an
// error wrapping ErrFrameTooLarge, and nothing is allocated for it.
func TestOversizedRecordRefusedBeforeAlloc(t *testing.T) {
	key, wire := sealedRecords(t, make([]byte, 2000))
	r := readerOver(t, key, wire, 1000)
	_, err := r.ReadFrameInto(func(int) []byte { t.Fatal("alloc called for an oversized record"); return nil })
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("err = %v, want ErrFrameTooLarge", err)
	}
}

// TestStrangerIsNotAccepted: connections that send nothing, garbage or a
// hello under another key are closed, and the peer holding the offer still
// gets through.
func TestStrangerIsNotAccepted(t *testing.T) {
	l, err := Listen(loopback)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offer := l.Offer()
	port := binary.BigEndian.Uint16(offer)
	addr := &net.TCPAddr{IP: loopback, Port: int(port)}
	// A stranger with garbage, one with another key, one that closes at once.
	garbage, err := net.DialTCP("tcp", nil, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	_, _ = garbage.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	other := bytes.Clone(offer)
	other[2] ^= 1
	wrongKey, err := Dial(ctx, loopback, other)
	if err != nil {
		t.Fatal(err)
	}
	defer wrongKey.Close()
	got := acceptAsync(ctx, l, 1<<10)
	w, err := Dial(ctx, loopback, offer)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.WriteFrame([]byte("from the peer")); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	defer a.r.Close()
	f, err := a.r.ReadFrameInto(alloc)
	if err != nil || string(f) != "from the peer" {
		t.Fatalf("read %q, %v; want the peer's frame", f, err)
	}
	// The listener is closed once the peer is in.
	if c, err := net.DialTCP("tcp", nil, addr); err == nil {
		c.Close()
		t.Fatal("the port still accepts connections after the peer's")
	}
}

// TestListenerTakesOnlyThePeersAddress: with ExpectFrom, a connection
// from another address is closed unread even when its hello would open
// (here 127.0.0.2, which Linux routes over loopback too), and the key
// holder at the expected address still gets in.
func TestListenerTakesOnlyThePeersAddress(t *testing.T) {
	l, err := Listen(loopback)
	if err != nil {
		t.Fatal(err)
	}
	l.ExpectFrom(loopback)
	offer := l.Offer()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := acceptAsync(ctx, l, 1<<10)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	other, err := d.DialContext(ctx, "tcp", (&net.TCPAddr{IP: loopback, Port: int(binary.BigEndian.Uint16(offer))}).String())
	if err != nil {
		t.Skipf("no second loopback address here: %v", err)
	}
	defer other.Close()
	aead, err := newAEAD(offer[2:])
	if err != nil {
		t.Fatal(err)
	}
	w := Writer{c: other, seal: newSealer(aead, fromDialer)}
	if err := w.WriteFrame(hello); err != nil {
		t.Fatal(err)
	}
	_ = other.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := other.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection from 127.0.0.2 was kept open (%v)", err)
	}
	select {
	case a := <-got:
		t.Fatalf("Accept returned %v, %v for a connection from another address", a.r, a.err)
	default:
	}
	w2, err := Dial(ctx, loopback, offer)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	a := <-got
	if a.err != nil {
		t.Fatalf("the key holder at the expected address was not accepted: %v", a.err)
	}
	a.r.Close()
}

// TestAcceptEndsWithContext: Accept with no dialer returns when its
// context ends.
func TestAcceptEndsWithContext(t *testing.T) {
	l, err := Listen(loopback)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Accept(ctx, 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// TestDialRefusesABadOffer: an offer of the wrong size, or of a port below
// MinPort, is an error naming it, and nothing is dialed.
func TestDialRefusesABadOffer(t *testing.T) {
	if _, err := Dial(context.Background(), loopback, make([]byte, OfferSize-1)); err == nil {
		t.Fatal("a short offer was dialed")
	}
	// A listener on port 1023 of loopback would take the dial if it were
	// made (binding it needs root: without, the refusal is still checked).
	if ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: loopback, Port: 1023}); err == nil {
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				t.Error("a privileged port was dialed")
				c.Close()
			}
		}()
	}
	offer := binary.BigEndian.AppendUint16(nil, 1023)
	offer = append(offer, make([]byte, KeySize)...)
	_, err := Dial(context.Background(), loopback, offer)
	if err == nil || !strings.Contains(err.Error(), "port 1023") {
		t.Fatalf("err = %v, want a refusal naming port 1023", err)
	}
	if _, err := DialReader(context.Background(), loopback, offer, 10); err == nil {
		t.Fatal("DialReader dialed port 1023")
	}
}

// TestListenerCanWrite: on a link from AcceptWriter and DialReader the
// listener's frames reach the dialer whole and in order.
func TestListenerCanWrite(t *testing.T) {
	l, err := Listen(loopback)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan *Writer, 1)
	go func() {
		w, err := l.AcceptWriter(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	r, err := DialReader(ctx, loopback, l.Offer(), 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w := <-got
	if w == nil {
		t.FailNow()
	}
	frames := [][]byte{[]byte("one"), {}, bytes.Repeat([]byte{5}, 1<<16)}
	go func() {
		defer w.Close()
		for _, f := range frames {
			if err := w.WriteFrame(f); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i, want := range frames {
		f, err := r.ReadFrameInto(alloc)
		if err != nil || !bytes.Equal(f, want) {
			t.Fatalf("frame %d: %d bytes, %v; want %d bytes", i, len(f), err, len(want))
		}
	}
	if _, err := r.ReadFrameInto(alloc); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
}

// TestReflectedRecordsDoNotOpen: records sealed in one direction do not
// open as the other direction's (each direction has its own nonces), so
// neither end's records can be sent back to it as the other's.
func TestReflectedRecordsDoNotOpen(t *testing.T) {
	key, wire := sealedRecords(t, []byte("from the dialer")) // the dialer's direction
	r := readerOver(t, key, wire, 1<<10)
	aead, err := newAEAD(key)
	if err != nil {
		t.Fatal(err)
	}
	r.open = newSealer(aead, fromListener)
	if f, err := r.ReadFrameInto(alloc); err == nil {
		t.Fatalf("a dialer's record opened as the listener's: %q", f)
	}
}

// TestSilentStrangerDoesNotDelayThePeer: a stranger who connects first
// and sends nothing does not hold up the key holder's hello. Accept is given
// less time than HelloTimeout: reading hellos one after the other, it would
// wait on the stranger's until its context ended.
func TestSilentStrangerDoesNotDelayThePeer(t *testing.T) {
	l, err := Listen(loopback)
	if err != nil {
		t.Fatal(err)
	}
	offer := l.Offer()
	addr := &net.TCPAddr{IP: loopback, Port: int(binary.BigEndian.Uint16(offer))}
	stranger, err := net.DialTCP("tcp", nil, addr) // first in the accept queue
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	ctx, cancel := context.WithTimeout(context.Background(), HelloTimeout/2)
	defer cancel()
	got := acceptAsync(ctx, l, 1<<10)
	w, err := Dial(ctx, loopback, offer)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	a := <-got
	if a.err != nil {
		t.Fatalf("the key holder was not accepted while a stranger stayed silent: %v", a.err)
	}
	a.r.Close()
	// The stranger's connection was closed with the listener.
	_ = stranger.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := stranger.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the stranger's connection is still open (read %d, %v)", n, err)
	}
}

// FuzzReader: whatever bytes arrive, the reader returns frames or an
// error, never panics, and every frame it returns is one that was sealed
// under the key, at its index (the seeds are two valid records).
func FuzzReader(f *testing.F) {
	a, b := []byte("first frame"), bytes.Repeat([]byte{9}, 300)
	key, wire := sealedRecords(f, a, b)
	f.Add(wire)
	f.Add(wire[:len(wire)/2])
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, in []byte) {
		here, there := net.Pipe()
		defer here.Close()
		go func() {
			_, _ = there.Write(in)
			there.Close()
		}()
		aead, err := newAEAD(key)
		if err != nil {
			t.Fatal(err)
		}
		r := &Reader{c: here, open: sealer{aead: aead}, max: 1 << 12}
		for i := 0; ; i++ {
			got, err := r.ReadFrameInto(alloc)
			if err != nil {
				return
			}
			if i > 1 || !bytes.Equal(got, [][]byte{a, b}[i]) {
				t.Fatalf("record %d opened to %d bytes that were never sealed there", i, len(got))
			}
		}
	})
}
