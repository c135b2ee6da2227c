package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/train"
)

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// liveLine is a terminal writer with one status line kept at the bottom:
// whatever else is written (log lines) first erases the status line, then
// the status line is drawn again below it, so the two never run together.
type liveLine struct {
	mu   sync.Mutex
	w    io.Writer
	line string // the status line shown, "" for none
	// partial is set while a write did not end in a newline: the status
	// line is not redrawn in the middle of someone's line.
	partial bool
}

// Write implements io.Writer for everything but the status line.
func (l *liveLine) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.line != "" && !l.partial {
		if _, err := io.WriteString(l.w, "\r\033[K"); err != nil {
			return 0, err
		}
	}
	n, err := l.w.Write(p)
	if err != nil {
		return n, err
	}
	l.partial = len(p) > 0 && !bytes.HasSuffix(p, []byte("\n"))
	if l.line != "" && !l.partial {
		_, err = io.WriteString(l.w, l.line)
	}
	return n, err
}

// Set replaces the status line ("" removes it).
func (l *liveLine) Set(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.partial {
		fmt.Fprint(l.w, "\r\033[K"+line)
	}
	l.line = line
}

// progressPrinter returns the step callback. On a terminal (live not nil)
// it keeps a status line with elapsed time and ETA at the bottom of the
// screen; otherwise it logs a structured line every 10 steps.
func progressPrinter(live *liveLine, log *zap.Logger) func(train.Progress) {
	if live != nil {
		eta := newETA(time.Now())
		return func(p train.Progress) {
			elapsed, left := eta.update(time.Now(), p.Step, p.Steps)
			acc := "-"
			if p.Accuracy >= 0 {
				acc = fmt.Sprintf("%.2f%%", 100*p.Accuracy)
			}
			live.Set(fmt.Sprintf("step %d/%d  loss %.4f  acc %s  %.0f samples/s  %s/step sent  ring %d (epoch %d)  %s elapsed  ETA %s",
				p.Step, p.Steps, p.Loss, acc, p.SamplesPerS, humanBytes(p.BytesPerStep), p.Peers, p.Epoch,
				clock(elapsed), etaString(left)))
		}
	}
	return func(p train.Progress) {
		if p.Step%10 != 0 && p.Step != p.Steps {
			return
		}
		log.Info("progress", zap.Uint64("step", p.Step), zap.Uint64("steps", p.Steps), zap.Float64("loss", p.Loss),
			zap.Float64("accuracy", p.Accuracy), zap.Float64("samples_per_s", p.SamplesPerS),
			zap.Float64("bytes_per_step", p.BytesPerStep), zap.Int("peers", p.Peers), zap.Uint64("epoch", p.Epoch))
	}
}

// eta estimates the time left from the recent pace: an exponential moving
// average of wall time per step (waits and retries included), so a change
// of pace (a slower ring after a member joined) shows within ~20 steps.
type eta struct {
	start, last time.Time
	lastStep    uint64
	perStep     float64 // seconds; 0 before the first measurement
}

func newETA(start time.Time) *eta { return &eta{start: start, last: start} }

// etaSmoothing is the weight of the newest step in the moving average.
const etaSmoothing = 0.1

// update records that step of steps is done at now; it returns the time
// since the start and the estimated time left (negative: unknown yet).
func (e *eta) update(now time.Time, step, steps uint64) (elapsed, left time.Duration) {
	if step > e.lastStep {
		per := now.Sub(e.last).Seconds() / float64(step-e.lastStep)
		if e.perStep == 0 {
			e.perStep = per
		} else {
			e.perStep += etaSmoothing * (per - e.perStep)
		}
		e.last, e.lastStep = now, step
	}
	elapsed = now.Sub(e.start)
	if e.perStep == 0 || step > steps {
		return elapsed, -1
	}
	return elapsed, time.Duration(e.perStep * float64(steps-step) * float64(time.Second))
}

// clock formats d as h:mm:ss or m:ss.
func clock(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

func etaString(left time.Duration) string {
	if left < 0 {
		return "-"
	}
	return clock(left)
}

// clearProgress ends the in-place display.
func clearProgress(live *liveLine) {
	if live != nil {
		live.Set("")
	}
}

// runSummary is the closing line of a run: what it cost.
func runSummary(res train.Result, wall time.Duration, sent, received int64) string {
	steps := fmt.Sprintf("%d steps", res.Step)
	switch {
	case res.Resumed > 0:
		steps = fmt.Sprintf("%d steps (%d to %d, resumed from a checkpoint)", res.Trained, res.Resumed, res.Step)
	case res.Trained < res.Step:
		steps = fmt.Sprintf("%d of %d steps trained here (the others came with a member's state)", res.Trained, res.Step)
	}
	return fmt.Sprintf("summary: %s in %s, sent %s, received %s, %d steps retried, %d states taken over",
		steps, wall.Round(time.Second/10), humanBytes(float64(sent)), humanBytes(float64(received)), res.Retries, res.Resyncs)
}

func humanBytes(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}
