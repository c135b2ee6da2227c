package allreduce_test

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/p2ptrain/p2ptrain/allreduce"
)

func TestFrameRoundTrip(t *testing.T) {
	h := allreduce.Header{Phase: allreduce.PhaseGather | 3<<4, Codec: 0xdeadbeef, Epoch: 7, Step: 1 << 40, Bucket: 3, Chunk: 99}
	f := allreduce.MarshalFrame(nil, h, []byte("payload"))
	if len(f) != allreduce.HeaderSize+7 {
		t.Fatalf("frame length %d", len(f))
	}
	g, p, err := allreduce.UnmarshalFrame(f, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	h.Version, h.Length = allreduce.FrameVersion, 7
	if g != h || string(p) != "payload" || g.Phase.Sub() != 3 || g.Phase.Kind() != allreduce.PhaseGather {
		t.Fatalf("got %+v %q, want %+v", g, p, h)
	}
	for _, tc := range []struct {
		name string
		mod  func([]byte) []byte
		max  int
		want error
	}{
		{"version", func(b []byte) []byte { b[0] = 2; return b }, 1 << 10, allreduce.ErrBadFrame},
		{"phase", func(b []byte) []byte { b[1] = 7; return b }, 1 << 10, allreduce.ErrBadFrame},
		{"reserved", func(b []byte) []byte { b[3] = 1; return b }, 1 << 10, allreduce.ErrBadFrame},
		{"length", func(b []byte) []byte { return append(b, 0) }, 1 << 10, allreduce.ErrBadFrame},
		{"truncated", func(b []byte) []byte { return b[:20] }, 1 << 10, allreduce.ErrBadFrame},
		{"oversize", func(b []byte) []byte { return b }, 40, allreduce.ErrFrameTooLarge},
	} {
		b := tc.mod(append([]byte(nil), f...))
		if _, _, err := allreduce.UnmarshalFrame(b, tc.max); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestReadWriteFrame(t *testing.T) {
	var buf bytes.Buffer
	for _, f := range [][]byte{[]byte("a"), {}, bytes.Repeat([]byte{7}, 100)} {
		if _, err := allreduce.WriteFrame(&buf, f, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []int{1, 0, 100} {
		f, err := allreduce.ReadFrame(&buf, 100, nil)
		if err != nil || len(f) != want {
			t.Fatalf("got %d bytes, %v; want %d", len(f), err, want)
		}
	}
	_, _ = allreduce.WriteFrame(&buf, make([]byte, 101), nil)
	if _, err := allreduce.ReadFrame(&buf, 100, nil); !errors.Is(err, allreduce.ErrFrameTooLarge) {
		t.Fatalf("got %v, want ErrFrameTooLarge", err)
	}
	// A huge length prefix is refused without allocating.
	r := bytes.NewReader([]byte{0xff, 0xff, 0xff, 0xff})
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	if _, err := allreduce.ReadFrame(r, 1<<20, nil); !errors.Is(err, allreduce.ErrFrameTooLarge) {
		t.Fatalf("got %v", err)
	}
	runtime.ReadMemStats(&m1)
	if d := m1.TotalAlloc - m0.TotalAlloc; d > 64<<10 {
		t.Fatalf("refusing a frame allocated %d bytes", d)
	}
}

// FuzzUnmarshalFrame: the parser never panics, never accepts a frame above
// the maximum, and what it accepts marshals back to the same bytes.
func FuzzUnmarshalFrame(f *testing.F) {
	f.Add(allreduce.MarshalFrame(nil, allreduce.Header{Phase: allreduce.PhaseReduce, Epoch: 1}, []byte{1, 2, 3}), 64)
	f.Add(allreduce.MarshalFrame(nil, allreduce.Header{Phase: allreduce.PhaseAbort}, []byte{1, 0, 0, 0}), 1<<20)
	f.Add([]byte("garbage"), 10)
	f.Fuzz(func(t *testing.T, b []byte, max int) {
		h, p, err := allreduce.UnmarshalFrame(b, max)
		if err != nil {
			if !errors.Is(err, allreduce.ErrBadFrame) && !errors.Is(err, allreduce.ErrFrameTooLarge) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if len(b) > max {
			t.Fatalf("accepted %d bytes > max %d", len(b), max)
		}
		if g := allreduce.MarshalFrame(nil, h, p); !bytes.Equal(g, b) {
			t.Fatalf("round trip differs")
		}
	})
}

// FuzzReadFrame: the stream reader never panics or allocates past max.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{3, 0, 0, 0, 1, 2, 3}, 8)
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f}, 8)
	f.Fuzz(func(t *testing.T, b []byte, max int) {
		fr, err := allreduce.ReadFrame(bytes.NewReader(b), max, nil)
		if err == nil && len(fr) > max {
			t.Fatalf("read %d bytes > max %d", len(fr), max)
		}
	})
}
