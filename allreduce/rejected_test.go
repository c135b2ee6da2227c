package allreduce_test

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/memtransport"
)

// rejectLog is a Transport that records what its session reports through
// allreduce.FrameRejecter.
type rejectLog struct {
	allreduce.Transport
	mu   sync.Mutex
	from []allreduce.PeerID
	errs []error
}

func (r *rejectLog) FrameRejected(from allreduce.PeerID, err error) {
	r.mu.Lock()
	r.from = append(r.from, from)
	r.errs = append(r.errs, err)
	r.mu.Unlock()
}

// rejectRound runs one step of epoch 5 on w peers whose transports are
// rejectLogs, after setup, and returns the logs once every peer has failed.
func rejectRound(t *testing.T, w int, setup func(net *memtransport.Network)) []*rejectLog {
	t.Helper()
	opts := memOpts()
	opts.MaxFrame = 1 << 20
	c := &cluster{net: memtransport.New(opts), peers: peerIDs(w)}
	logs := make([]*rejectLog, w)
	for i, p := range c.peers {
		logs[i] = &rejectLog{Transport: c.net.Endpoint(p)}
		s, err := allreduce.NewSession(allreduce.Ring{Number: 5, Peers: c.peers, Self: p}, logs[i],
			allreduce.Config{ChunkBytes: 256})
		if err != nil {
			t.Fatal(err)
		}
		c.sessions = append(c.sessions, s)
	}
	defer c.close()
	setup(c.net)
	_, data, codecs := oneBucket(w)
	_, errs := c.round(9, data, codecs)
	for i, err := range errs {
		if err == nil {
			t.Fatalf("peer %d: the round succeeded", i)
		}
	}
	return logs
}

// TestRejectedFramesReachTheTransport: a frame a session refuses is
// reported to its transport once, naming the sender and wrapping the
// refusal; the other members, which learn of the failure from abort
// notices, report nothing.
func TestRejectedFramesReachTheTransport(t *testing.T) {
	fp := allreduce.CodecID(fakeFP32{}.Spec())
	for _, tc := range []struct {
		name  string
		frame []byte
		want  error
	}{
		{"garbage", []byte("this is not a frame, not at all, but it is long enough"), allreduce.ErrBadFrame},
		{"wrong-epoch", frameFor(4, 9, allreduce.PhaseReduce, fp, make([]byte, 4)), allreduce.ErrEpochMismatch},
		{"wrong-codec", frameFor(5, 9, allreduce.PhaseReduce, 12345, make([]byte, 4)), allreduce.ErrCodecMismatch},
		{"oversize", make([]byte, 1<<20+1), allreduce.ErrFrameTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				logs := rejectRound(t, 3, func(net *memtransport.Network) { net.Inject("peer-0", "peer-1", tc.frame) })
				for i, l := range logs {
					want := 0
					if i == 1 {
						want = 1
					}
					if len(l.from) != want {
						t.Fatalf("peer %d reported %d rejected frames (%v), want %d", i, len(l.from), l.errs, want)
					}
				}
				if l := logs[1]; l.from[0] != "peer-0" || !errors.Is(l.errs[0], tc.want) {
					t.Errorf("peer 1 reported a frame from %s refused with %v, want one from peer-0 wrapping %v", l.from[0], l.errs[0], tc.want)
				}
			})
		})
	}
}

// TestFailuresThatRefuseNoFrameAreNotReported: a peer that dies refuses
// no frame; no transport hears of a rejection.
func TestFailuresThatRefuseNoFrameAreNotReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := rejectRound(t, 3, func(net *memtransport.Network) { net.Kill("peer-2") })
		for i, l := range logs {
			if len(l.from) != 0 {
				t.Errorf("peer %d reported rejected frames: %v", i, l.errs)
			}
		}
	})
}
