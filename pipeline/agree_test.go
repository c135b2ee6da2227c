package pipeline

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
)

// TestAgree: every stage of a pipeline returns the last stage's loss and
// one verdict, true only when every stage's gradient can be applied.
func TestAgree(t *testing.T) {
	const S = 3
	cfg := model.Config{MaxBatch: 4, GPT: tinyGPT}
	split, _, err := Balance([]float64{1, 1, 1, 1, 1}, S)
	if err != nil {
		t.Fatal(err)
	}
	for bad := -1; bad < S; bad++ {
		t.Run(fmt.Sprintf("stage %d refuses", bad), func(t *testing.T) {
			net := NewMemNetwork(S)
			stages := make([]*Stage, S)
			for s := range S {
				m, err := model.NewStage("gpt", cfg, gpu.NewCPU(s), 1, split[s], split[s+1])
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(m.Close)
				if stages[s], err = NewStage(m, net.Stage(s), Config{Stages: S, Stage: s, Micro: 1}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a deadlock, not a wait
			defer cancel()
			losses, oks, errs := make([]float64, S), make([]bool, S), make([]error, S)
			var wg sync.WaitGroup
			for s, st := range stages {
				wg.Add(1)
				go func() {
					defer wg.Done()
					losses[s], oks[s], errs[s] = st.Agree(ctx, 7, s != bad, float64(s)+0.5)
				}()
			}
			wg.Wait()
			for s := range S {
				if errs[s] != nil {
					t.Fatalf("stage %d: %v", s, errs[s])
				}
				if losses[s] != S-0.5 || oks[s] != (bad < 0) {
					t.Fatalf("stage %d: loss %v verdict %v; want the last stage's loss %v and verdict %v", s, losses[s], oks[s], S-0.5, bad < 0)
				}
			}
			if n := net.Pending(); n != 0 {
				t.Fatalf("%d messages left unreceived", n)
			}
		})
	}
}
