package pipeline

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func opsString(ops []Op) string {
	s := ""
	for i, op := range ops {
		if i > 0 {
			s += " "
		}
		s += op.String()
	}
	return s
}

// TestOpsKnownOrders pins the two schedules' orders and recomputations on
// small cases.
func TestOpsKnownOrders(t *testing.T) {
	for _, tc := range []struct {
		sc          Schedule
		S, s, M     int
		want        string
		recomputes  int
		maxInFlight int
	}{
		{OneFOneB, 3, 0, 4, "F0 F1 F2 B0* F3 B1* B2* B3*", 4, 3},
		{OneFOneB, 3, 1, 4, "F0 F1 B0* F2 B1* F3 B2* B3*", 4, 2},
		{OneFOneB, 3, 2, 4, "F0 B0 F1 B1 F2 B2 F3 B3", 0, 1},
		{OneFOneB, 4, 0, 2, "F0 F1 B0* B1*", 2, 2},
		{GPipe, 3, 1, 3, "F0 F1 F2 B0* B1* B2*", 3, 3},
		{GPipe, 2, 0, 1, "F0 B0", 0, 1},
	} {
		ops, err := tc.sc.Ops(tc.S, tc.s, tc.M)
		if err != nil {
			t.Fatal(err)
		}
		if got := opsString(ops); got != tc.want {
			t.Errorf("%v stage %d of %d, %d micro-batches: %s, want %s", tc.sc, tc.s, tc.S, tc.M, got, tc.want)
		}
		rc, flight, peak := 0, 0, 0
		for _, op := range ops {
			if op.Kind == Forward {
				flight++
				peak = max(peak, flight)
			} else {
				flight--
				if op.Recompute {
					rc++
				}
			}
		}
		if rc != tc.recomputes || peak != tc.maxInFlight {
			t.Errorf("%v stage %d of %d: %d recomputations, %d inputs held; want %d, %d", tc.sc, tc.s, tc.S, rc, peak, tc.recomputes, tc.maxInFlight)
		}
	}
}

// TestOpsAreComplete checks, for many shapes, that every micro-batch has
// one forward pass followed later by one backward pass, that the backward
// passes run in micro-batch order (so both schedules accumulate alike),
// that 1F1B holds at most S−s inputs, and that neither schedule deadlocks.
func TestOpsAreComplete(t *testing.T) {
	for _, sc := range []Schedule{OneFOneB, GPipe} {
		for S := 1; S <= 6; S++ {
			for M := 1; M <= 9; M++ {
				for s := range S {
					ops, err := sc.Ops(S, s, M)
					if err != nil {
						t.Fatal(err)
					}
					fwd := make([]int, M)
					nextB, flight, peak := 0, 0, 0
					for i, op := range ops {
						switch op.Kind {
						case Forward:
							fwd[op.Micro]++
							flight++
							peak = max(peak, flight)
						case Backward:
							if op.Micro != nextB || fwd[op.Micro] != 1 {
								t.Fatalf("%v S=%d s=%d M=%d: op %d is %v", sc, S, s, M, i, op)
							}
							nextB++
							flight--
						}
					}
					if nextB != M || len(ops) != 2*M {
						t.Fatalf("%v S=%d s=%d M=%d: %s", sc, S, s, M, opsString(ops))
					}
					if sc == OneFOneB && peak > S-s {
						t.Errorf("1F1B S=%d s=%d M=%d holds %d inputs", S, s, M, peak)
					}
				}
				tm := Timing{Forward: make([]float64, S), Backward: make([]float64, S), Transfer: make([]float64, S-1)}
				if _, err := sc.Simulate(tm, M); err != nil {
					t.Errorf("%v S=%d M=%d: %v", sc, S, M, err)
				}
			}
		}
	}
	if _, err := OneFOneB.Ops(2, 2, 1); err == nil {
		t.Error("stage 2 of 2: no error")
	}
	if _, err := Schedule(7).Ops(2, 0, 1); err == nil {
		t.Error("unknown schedule: no error")
	}
	if _, err := ParseSchedule("pipedream"); err == nil {
		t.Error("ParseSchedule(pipedream): no error")
	}
	for _, sc := range []Schedule{OneFOneB, GPipe} {
		if p, err := ParseSchedule(sc.String()); err != nil || p != sc {
			t.Errorf("ParseSchedule(%v) = %v, %v", sc, p, err)
		}
	}
}

// gpipeClosedForm is GPipe's step time for one micro-batch (M = 1, no
// recomputation) or when no stage ever waits for a gradient longer than
// its recomputation takes: a flow line of the stages and the hops' links
// forward, then the same backward, each Σ times + Σ latencies +
// (M−1)·slowest (with M > 1 every backward pass recomputes its forward
// pass).
func gpipeClosedForm(t Timing, M int) float64 {
	phase := func(stage []float64) float64 {
		sum, slow := 0.0, 0.0
		for _, v := range stage {
			sum += v
			slow = max(slow, v)
		}
		for _, v := range t.Transfer {
			sum += v + t.Latency
			slow = max(slow, v)
		}
		return sum + float64(M-1)*slow
	}
	back := make([]float64, len(t.Backward))
	for s := range back {
		back[s] = t.Backward[s]
		if M > 1 {
			back[s] += t.Forward[s]
		}
	}
	return phase(t.Forward) + phase(back)
}

// TestSimulateGPipeClosedForm checks the simulator against GPipe's closed
// form on random stage times, links and latencies for one micro-batch,
// and against the bubble with S equal stages and free links: (M+S−1) slots
// of one micro-batch's work (its forward pass twice and its backward
// pass), of which M are busy, less the (S−1) forward passes that the
// stages before the last recompute while the last stage still works.
func TestSimulateGPipeClosedForm(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for range 300 {
		S, M := 1+rng.IntN(6), 1
		tm := Timing{Latency: rng.Float64() * 0.1}
		for s := range S {
			tm.Forward = append(tm.Forward, rng.Float64())
			tm.Backward = append(tm.Backward, 2*rng.Float64())
			if s > 0 {
				tm.Transfer = append(tm.Transfer, rng.Float64())
			}
		}
		got, err := GPipe.Simulate(tm, M)
		if err != nil {
			t.Fatal(err)
		}
		if want := gpipeClosedForm(tm, M); math.Abs(got-want) > 1e-9*want {
			t.Fatalf("S=%d M=%d %+v: simulated %v, closed form %v", S, M, tm, got, want)
		}
	}
	for S := 1; S <= 5; S++ {
		for M := 2; M <= 8; M++ {
			f, b := 1.0, 2.0
			tm := Timing{Forward: make([]float64, S), Backward: make([]float64, S), Transfer: make([]float64, S-1)}
			for s := range S {
				tm.Forward[s], tm.Backward[s] = f, b
			}
			g, _ := GPipe.Simulate(tm, M)
			if want := float64(M+S-1)*(2*f+b) - float64(S-1)*f; g != want {
				t.Errorf("GPipe S=%d M=%d: %v, want (M+S−1)(2f+b) − (S−1)f = %v", S, M, g, want)
			}
			o, _ := OneFOneB.Simulate(tm, M)
			if busy := float64(M) * (f + b); o > g || o < busy {
				t.Errorf("1F1B S=%d M=%d: %v, want between the busiest stage's %v and GPipe's %v", S, M, o, busy, g)
			}
		}
	}
}

// TestSimulateRecomputesWhileTheGradientTravels: on 2 stages and a slow
// link, the first stage recomputes a micro-batch's forward pass while its
// gradient is on the way, as Stage.Step does (recompute, then receive), so
// only the backward pass waits for it. Worked by hand: forward 1, backward
// 2 on both stages, 3 per message, no latency, M = 2.
func TestSimulateRecomputesWhileTheGradientTravels(t *testing.T) {
	tm := Timing{Forward: []float64{1, 1}, Backward: []float64{2, 2}, Transfer: []float64{3}}
	// 1F1B: stage 0 runs F0 F1 B0* B1*, stage 1 F0 B0 F1 B1. The
	// activations reach stage 1 at 4 and 7, its gradients leave at 7 and
	// 10 and reach stage 0 at 10 and 13; stage 0 recomputes micro-batch 0
	// from 2 to 3, runs B0 from 10 to 12, recomputes micro-batch 1 from 12
	// to 13 and runs B1 from 13 to 15 (waiting for the gradients before
	// recomputing would end at 16).
	// GPipe: stage 1 runs F0 4–5, F1 7–8, B0* 8–11, B1* 11–14, its
	// gradients reach stage 0 at 14 and 17; stage 0 recomputes 2–3, runs
	// B0 14–16, recomputes 16–17 and runs B1 17–19 (the closed form, which
	// waits, says 20).
	for _, c := range []struct {
		sc   Schedule
		want float64
	}{{OneFOneB, 15}, {GPipe, 19}} {
		got, err := c.sc.Simulate(tm, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%v: %v, want %v", c.sc, got, c.want)
		}
	}
	if cf := gpipeClosedForm(tm, 2); cf != 20 {
		t.Errorf("the closed form of the waiting schedule: %v, want 20", cf)
	}
}

// TestSimulateErrors checks malformed timings.
func TestSimulateErrors(t *testing.T) {
	for i, tm := range []Timing{
		{},
		{Forward: []float64{1}, Backward: []float64{1, 2}},
		{Forward: []float64{1, 1}, Backward: []float64{1, 2}},
	} {
		if _, err := OneFOneB.Simulate(tm, 2); err == nil {
			t.Errorf("timing %d: no error", i)
		}
	}
	tm := Timing{Forward: []float64{1}, Backward: []float64{1}}
	if _, err := OneFOneB.Simulate(tm, 0); err == nil {
		t.Error("0 micro-batches: no error")
	}
}

func ExampleSchedule_Ops() {
	for s := range 3 {
		ops, _ := OneFOneB.Ops(3, s, 4)
		fmt.Printf("stage %d: %s\n", s, opsString(ops))
	}
	// Output:
	// stage 0: F0 F1 F2 B0* F3 B1* B2* B3*
	// stage 1: F0 F1 B0* F2 B1* F3 B2* B3*
	// stage 2: F0 B0 F1 B1 F2 B2 F3 B3
}
