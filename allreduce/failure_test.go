package allreduce_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/memtransport"
	"github.com/p2ptrain/p2ptrain/compress"
)

// failRound runs one step of a 1000-value fp32 bucket (tiny chunks) on W
// peers after setup, and checks every peer fails with a *PeerError wrapping
// want, with its output untouched.
func failRound(t *testing.T, w int, cfg allreduce.Config, opts memtransport.Options,
	setup func(c *cluster), want error) []*allreduce.PeerError {
	t.Helper()
	if cfg.ChunkBytes == 0 {
		cfg.ChunkBytes = 256
	}
	c := newCluster(t, w, 5, cfg, opts)
	defer c.close()
	setup(c)
	d, data, codecs := oneBucket(w)
	outs, errs := c.round(9, data, codecs)
	pes := make([]*allreduce.PeerError, w)
	for i, err := range errs {
		var pe *allreduce.PeerError
		if !errors.As(err, &pe) {
			t.Fatalf("peer %d: error %v is not a *PeerError", i, err)
		}
		if want != nil && !errors.Is(err, want) {
			t.Errorf("peer %d: error %v does not wrap %v", i, err, want)
		}
		if pe.Epoch != 5 {
			t.Errorf("peer %d: epoch %d in %v", i, pe.Epoch, err)
		}
		for _, v := range outs[i][0] {
			if !math.IsNaN(float64(v)) {
				t.Fatalf("peer %d: output written on failure", i)
			}
		}
		pes[i] = pe
		// The session stays failed: a new round fails at once with the same error.
		r := c.sessions[i].NewRound(context.Background(), 10)
		_ = r.Add(allreduce.Bucket{ID: 0, Codec: fakeFP32{}, Data: d[i], Out: make([]float32, len(d[i]))})
		if err2 := r.Wait(); err2 == nil {
			t.Fatalf("peer %d: round after failure succeeded", i)
		}
	}
	return pes
}

// oneBucket is the data of a step of one 1000-value fp32 bucket on w peers:
// each peer's gradient, and the same as the buckets and codecs of c.round.
func oneBucket(w int) (d [][]float32, data [][][]float32, codecs [][]compress.Codec) {
	d = randData(1, w, 1000)
	data = make([][][]float32, w)
	codecs = make([][]compress.Codec, w)
	for i := range data {
		data[i] = [][]float32{d[i]}
		codecs[i] = []compress.Codec{fakeFP32{}}
	}
	return d, data, codecs
}

func TestPeerDiesMidRound(t *testing.T) {
	for _, sched := range []allreduce.Schedule{allreduce.ScheduleRing, allreduce.ScheduleDirect} {
		t.Run(string(sched), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pes := failRound(t, 5, allreduce.Config{Schedule: sched}, memOpts(), func(c *cluster) {
					c.net.SetHook(func(from, to allreduce.PeerID, frame []byte) error {
						if from == "peer-2" && c.net.Sent(from) == 3 {
							c.net.Kill(from)
							return memtransport.ErrDead
						}
						return nil
					})
				}, allreduce.ErrPeerFailed)
				named := 0
				for i, pe := range pes {
					if i != 2 && pe.Peer == "peer-2" {
						named++
					}
				}
				if named == 0 {
					t.Errorf("no surviving peer names peer-2: %v", pes)
				}
			})
		})
	}
}

func TestBrokenLink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		failRound(t, 4, allreduce.Config{}, memOpts(), func(c *cluster) {
			c.net.Break("peer-1", "peer-2")
		}, allreduce.ErrPeerFailed)
	})
}

func TestSlowPeerPassesDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		pes := failRound(t, 4, allreduce.Config{FrameTimeout: 5 * time.Second}, memOpts(), func(c *cluster) {
			for _, p := range c.peers {
				c.net.SetDelay("peer-1", p, time.Hour)
			}
		}, nil)
		if el := time.Since(start); el < 5*time.Second || el > 30*time.Second {
			t.Errorf("round failed after %v, want about the 5s deadline", el)
		}
		for i, pe := range pes {
			if i != 1 && (pe.Peer != "peer-1" || !errors.Is(pe, allreduce.ErrTimeout)) {
				t.Errorf("peer %d: %v, want a timeout naming peer-1", i, pe)
			}
		}
	})
}

func TestDerivedDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		failRound(t, 3, allreduce.Config{TimeoutFloor: 2 * time.Second}, memOpts(), func(c *cluster) {
			c.net.SetDelay("peer-0", "peer-1", time.Hour)
		}, nil)
		if el := time.Since(start); el < 2*time.Second || el > 10*time.Second {
			t.Errorf("round failed after %v, want the 2s floor", el)
		}
	})
}

func frameFor(epoch uint64, step uint64, phase allreduce.Phase, codec uint32, payload []byte) []byte {
	return allreduce.MarshalFrame(nil, allreduce.Header{Phase: phase, Codec: codec, Epoch: epoch, Step: step}, payload)
}

func TestInvalidFrames(t *testing.T) {
	fp := allreduce.CodecID(fakeFP32{}.Spec())
	cases := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"wrong-epoch", frameFor(4, 9, allreduce.PhaseReduce, fp, make([]byte, 4)), allreduce.ErrEpochMismatch},
		{"garbage", []byte("this is not a frame, not at all, but it is long enough"), allreduce.ErrBadFrame},
		{"short", []byte{1, 2, 3}, allreduce.ErrBadFrame},
		{"bad-length", func() []byte {
			f := frameFor(5, 9, allreduce.PhaseReduce, fp, make([]byte, 8))
			return f[:len(f)-1]
		}(), allreduce.ErrBadFrame},
		{"wrong-codec", frameFor(5, 9, allreduce.PhaseReduce, 12345, make([]byte, 4)), allreduce.ErrCodecMismatch},
		{"corrupt-payload", frameFor(5, 9, allreduce.PhaseReduce, fp, make([]byte, 3)), allreduce.ErrBadFrame},
		{"oversize", make([]byte, 1<<20+1), allreduce.ErrFrameTooLarge},
		{"bad-abort", frameFor(5, 9, allreduce.PhaseAbort, 0, []byte{9}), allreduce.ErrBadFrame},
		// Frames outside the round's step window are refused, not buffered
		// (a member once made its victim buffer 600 MiB of far-future frames).
		{"far-future-step", frameFor(5, 1<<40, allreduce.PhaseReduce, fp, make([]byte, 4)), allreduce.ErrBadFrame},
		{"past-step", frameFor(5, 8, allreduce.PhaseReduce, fp, make([]byte, 4)), allreduce.ErrBadFrame},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				opts := memOpts()
				opts.MaxFrame = 1 << 20
				// Ring: peer-1 receives from peer-0. Inject before peer-0's first frame.
				pes := failRound(t, 3, allreduce.Config{}, opts, func(c *cluster) {
					c.net.Inject("peer-0", "peer-1", tc.frame)
				}, tc.want)
				for i, pe := range pes {
					if pe.Peer != "peer-0" {
						t.Errorf("peer %d: %v does not name peer-0", i, pe)
					}
				}
			})
		})
	}
}

// TestBufferedBytesBounded: a peer whose unread frames exceed
// Config.MaxBufferedBytes fails the session and is named, however many it
// sends.
func TestBufferedBytesBounded(t *testing.T) {
	fp := allreduce.CodecID(fakeFP32{}.Spec())
	synctest.Test(t, func(t *testing.T) {
		opts := memOpts()
		opts.MaxFrame = 1 << 20
		cfg := allreduce.Config{MaxFrameBytes: 1 << 20, MaxBufferedBytes: 1 << 20}
		pes := failRound(t, 3, cfg, opts, func(c *cluster) {
			// Frames for the next step, which no round reads yet.
			for range 20 {
				c.net.Inject("peer-0", "peer-1", frameFor(5, 10, allreduce.PhaseReduce, fp, make([]byte, 64<<10)))
			}
		}, allreduce.ErrFrameTooLarge)
		for i, pe := range pes {
			if pe.Peer != "peer-0" {
				t.Errorf("peer %d: %v does not name peer-0", i, pe)
			}
		}
	})
}

func TestContextCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 3, 1, allreduce.Config{}, memOpts())
		defer c.close()
		ctx, cancel := context.WithCancel(context.Background())
		r := c.sessions[0].NewRound(ctx, 0)
		d := make([]float32, 10)
		_ = r.Add(allreduce.Bucket{ID: 1, Codec: fakeFP32{}, Data: d, Out: d})
		cancel()
		err := r.Wait()
		if !errors.Is(err, allreduce.ErrAborted) {
			t.Fatalf("got %v, want ErrAborted", err)
		}
		// The others learn about it from the abort notice.
		for i := 1; i < 3; i++ {
			err := c.sessions[i].AllReduce(context.Background(), 0, allreduce.Bucket{ID: 1, Codec: fakeFP32{}, Data: d, Out: d})
			var pe *allreduce.PeerError
			if !errors.As(err, &pe) || pe.Peer != "peer-0" {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
	})
}

// waitGoroutines polls until the goroutine count is back to base.
func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines leaked: %d > %d\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNoGoroutineLeakRealTime repeats success and failure rounds on the real
// clock and checks the goroutine count returns to where it started.
func TestNoGoroutineLeakRealTime(t *testing.T) {
	base := runtime.NumGoroutine()
	for iter := 0; iter < 3; iter++ {
		checkRound(t, fakeCases()[0], 4, 999, 128)
		failRound(t, 4, allreduce.Config{FrameTimeout: 50 * time.Millisecond}, memOpts(), func(c *cluster) {
			c.net.SetDelay("peer-3", "peer-0", time.Hour)
		}, allreduce.ErrTimeout)
		failRound(t, 4, allreduce.Config{}, memOpts(), func(c *cluster) { c.net.Kill("peer-1") }, allreduce.ErrPeerFailed)
	}
	waitGoroutines(t, base)
}

// TestClosedSession: rounds on a closed session fail with ErrClosed and
// write nothing; a round never waited for does not keep goroutines alive.
func TestClosedSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, 1, allreduce.Config{}, memOpts())
		r0 := c.sessions[0].NewRound(context.Background(), 0) // never waited
		_ = r0
		c.close()
		d := []float32{1, 2}
		out := []float32{7, 7}
		err := c.sessions[0].AllReduce(context.Background(), 1, allreduce.Bucket{ID: 0, Codec: fakeFP32{}, Data: d, Out: out})
		if !errors.Is(err, allreduce.ErrClosed) || out[0] != 7 {
			t.Fatalf("got %v, out %v", err, out)
		}
	})
}

// failingTransport fails every Recv at once, as a transport whose links are
// already broken when the session starts.
type failingTransport struct{}

func (failingTransport) Send(ctx context.Context, to allreduce.PeerID, frame []byte) error {
	return errors.New("link down")
}
func (failingTransport) Recv(ctx context.Context, from allreduce.PeerID) ([]byte, error) {
	return nil, errors.New("link down")
}
func (failingTransport) Reset(error) {}

// TestSessionFailsDuringConstruction: readers that fail while NewSession is
// still starting the others must find every send queue built (under -race
// this caught readers walking the queues the constructor was still filling).
func TestSessionFailsDuringConstruction(t *testing.T) {
	const w = 16
	ep := allreduce.Ring{Number: 1, Self: "peer-00"}
	for i := range w {
		ep.Peers = append(ep.Peers, allreduce.PeerID(fmt.Sprintf("peer-%02d", i)))
	}
	for range 20 {
		s, err := allreduce.NewSession(ep, failingTransport{}, allreduce.Config{})
		if err != nil {
			t.Fatal(err)
		}
		err = s.AllReduce(context.Background(), 0, allreduce.Bucket{ID: 0, Codec: fakeFP32{}, Data: make([]float32, 64), Out: make([]float32, 64)})
		if err == nil {
			t.Fatal("all-reduce over broken links succeeded")
		}
		s.Close()
	}
}
