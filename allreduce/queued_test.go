package allreduce_test

import (
	"context"
	"sync"
	"testing"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/memtransport"
	"github.com/p2ptrain/p2ptrain/compress"
)

// TestQueuedCountsTheRoundsFramesWhenWaitReturns: Session.Queued, read as
// Round.Wait returns, already counts every frame of the round, even those
// the writer has not yet handed to the Transport. Peer 0's uplink is slow,
// so its last frame is still on its way when the fast neighbour's last
// frame completes its round; the Transport's count at that moment would
// miss it (a step's traffic reported in the next step).
func TestQueuedCountsTheRoundsFramesWhenWaitReturns(t *testing.T) {
	const w, n = 2, 1 << 14
	c := newCluster(t, w, 1, allreduce.Config{}, memtransport.Options{})
	c.net.SetShape(c.peers[0], memtransport.Shape{Up: 2 << 20}) // 2 MiB/s: a 32 KiB frame takes ~16 ms
	data := randData(3, w, n)
	queued := make([]uint64, w)
	var wg sync.WaitGroup
	for i := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cd, err := compress.New("none", compress.Options{Layout: compress.FlatLayout(n), Seed: 1})
			if err != nil {
				t.Error(err)
				return
			}
			r := c.sessions[i].NewRound(context.Background(), 0)
			out := make([]float32, n)
			if err := r.Add(allreduce.Bucket{ID: 0, Codec: cd, Data: data[i], Out: out}); err != nil {
				t.Error(err)
			}
			if err := r.Wait(); err != nil {
				t.Error(err)
			}
			queued[i] = c.sessions[i].Queued()
		}()
	}
	wg.Wait()
	c.close() // flushes what the writers still held
	for i, p := range c.peers {
		sent, _ := c.net.Traffic(p)
		frames := int64(c.net.Sent(p))
		if want := sent - 4*frames; int64(queued[i]) != want || want == 0 {
			t.Errorf("peer %d: Queued() = %d as Wait returned, want the %d frame bytes its round sent", i, queued[i], want)
		}
	}
}
