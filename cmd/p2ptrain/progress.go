package main

import (
	"fmt"
	"io"
	"os"

	"github.com/p2ptrain/p2ptrain/train"
	"go.uber.org/zap"
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

// progressPrinter returns the step callback: a one-line display redrawn in
// place on a terminal, a structured log line every 10 steps otherwise.
func progressPrinter(w io.Writer, log *zap.Logger) func(train.Progress) {
	if isTerminal(w) {
		return func(p train.Progress) {
			acc := "-"
			if p.Accuracy >= 0 {
				acc = fmt.Sprintf("%.2f%%", 100*p.Accuracy)
			}
			fmt.Fprintf(w, "\r\033[Kstep %d/%d  loss %.4f  acc %s  %.0f samples/s  %s/step sent  ring %d (epoch %d)",
				p.Step, p.Steps, p.Loss, acc, p.SamplesPerS, humanBytes(p.BytesPerStep), p.Peers, p.Epoch)
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

// clearProgress ends the in-place display.
func clearProgress(w io.Writer) {
	if isTerminal(w) {
		fmt.Fprint(w, "\r\033[K")
	}
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
