package allreduce_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/allreduce/memtransport"
	"github.com/p2ptrain/p2ptrain/compress"
)

// TestInPlaceMatchesScratch: a bucket all-reduced in place, its Out
// aliasing its Data as the trainer hands it over, gets the same bits as
// one reduced into a scratch and copied out, round after round, for every
// schedule and codec class, robust aggregation too. A schedule that wrote a chunk's average before
// it read that chunk's Data would differ.
func TestInPlaceMatchesScratch(t *testing.T) {
	cases := []struct {
		spec   string
		sched  allreduce.Schedule
		w      int
		robust bool
	}{
		{"none", allreduce.ScheduleRing, 4, false}, {"none", allreduce.ScheduleDirect, 4, false}, {"none", allreduce.ScheduleProportional, 4, false},
		{"none", allreduce.ScheduleHierarchical, 8, false}, {"fp16", allreduce.ScheduleHierarchical, 6, false},
		{"int8", allreduce.ScheduleRing, 4, false}, {"sint8", "", 4, false}, {"qsgd:bits=4", "", 4, false},
		{"onebit", "", 4, false}, {"onebit", allreduce.ScheduleAllGather, 4, false}, {"topk:ratio=0.1", "", 4, false}, {"powersgd:rank=2", "", 4, false},
		{"none", allreduce.ScheduleDirect, 4, true}, {"int8", "", 4, true},
	}
	const n, rounds = 5003, 3
	for _, k := range cases {
		t.Run(fmt.Sprintf("%s/%s/%d/robust=%v", k.spec, k.sched, k.w, k.robust), func(t *testing.T) {
			cfg := allreduce.Config{ChunkBytes: 4096, Schedule: k.sched}
			if k.sched == allreduce.ScheduleProportional {
				cfg.Shares = []float64{0.1, 0.2, 0.3, 0.4}
			}
			if k.robust {
				cfg.Robust = &allreduce.Robust{Tau: 1, Iters: 2}
			}
			want := inPlaceRounds(t, k.spec, cfg, k.w, n, rounds, false)
			got := inPlaceRounds(t, k.spec, cfg, k.w, n, rounds, true)
			for r := range want {
				if !bitsEqual(got[r], want[r]) {
					t.Fatalf("round %d: the in-place average differs from the scratch one", r)
				}
			}
		})
	}
}

// inPlaceRounds runs rounds all-reduces of fresh data on w peers, in place
// (Out = a copy of Data, as the trainer's gradient buffer) or not, and
// returns peer 0's result of each after checking that every peer agrees.
func inPlaceRounds(t *testing.T, spec string, cfg allreduce.Config, w, n, rounds int, inPlace bool) [][]float32 {
	t.Helper()
	c := newCluster(t, w, 3, cfg, memtransport.Options{Capacity: 8})
	defer c.close()
	codecs := make([]compress.Codec, w)
	for i := range codecs {
		cd, err := compress.New(spec, compress.Options{Layout: layoutFor(spec, n), Seed: uint64(i + 1), SharedSeed: 42})
		if err != nil {
			t.Fatal(err)
		}
		codecs[i] = cd
	}
	var res [][]float32
	for step := range uint64(rounds) {
		d := randData(step+7, w, n)
		outs := make([][]float32, w)
		errs := make([]error, w)
		var wg sync.WaitGroup
		for i := range w {
			wg.Add(1)
			go func() {
				defer wg.Done()
				data := append([]float32(nil), d[i]...)
				out := data
				if !inPlace {
					out = make([]float32, n)
				}
				r := c.sessions[i].NewRound(context.Background(), step)
				if err := r.Add(allreduce.Bucket{ID: 0, Codec: codecs[i], Data: data, Out: out, InPlace: inPlace}); err != nil {
					errs[i] = err
				}
				if err := r.Wait(); err != nil {
					errs[i] = err
				}
				outs[i] = out
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("step %d: peer %d: %v", step, i, err)
			}
			if !bitsEqual(outs[0], outs[i]) {
				t.Fatalf("step %d: peer %d differs from peer 0", step, i)
			}
		}
		res = append(res, outs[0])
	}
	return res
}
