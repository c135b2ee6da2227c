package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/p2ptrain/p2ptrain/curves"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

const plotUsage = `Usage: p2ptrain plot FILE... -o OUT.svg|OUT.png [flags]

Draws training curves from metrics files (join --metrics-file), one colour
per file: training loss against step (a moving average over the raw loss),
test accuracy (or bits per byte) against step, and training loss against
wall time since each run's first record. Flags and files may be mixed.

`

func cmdPlot(args []string, stdout io.Writer) error {
	fs := newFlagSet("plot", stdout)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), plotUsage)
		fs.PrintDefaults()
	}
	out := fs.String("o", "", "write the figure to `FILE`; .svg or .png (required)")
	var labels stringList
	fs.Var(&labels, "label", "legend `NAME` of the next file, once per file in order (default: each file's name without extension)")
	title := fs.String("title", "", "a `TEXT` above the panels")
	panels := fs.String("panels", "", "the panels, left to right: a comma-separated `LIST` of loss, eval, time (default: each that has data)")
	width := fs.Int("width", 0, fmt.Sprintf("image width in `PIXELS` (default %d per panel)", curves.PanelWidth))
	height := fs.Int("height", curves.Height, "image height in `PIXELS`")
	smooth := fs.Float64("smooth", curves.DefaultSmoothing, "weight of the past in the loss's moving average, in [0, 1); 0 draws the raw loss alone")
	allPeers := fs.Bool("all-peers", false, "plot every peer a file holds records of (default: the first)")
	files, err := parseFlagsAndArgs(fs, args)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return usagef("plot: no metrics files given\n  (p2ptrain help plot shows how)")
	}
	if *out == "" {
		return usagef("plot: -o OUT.svg or -o OUT.png is required")
	}
	format, err := curves.FormatOf(*out)
	if err != nil {
		return usageError{err}
	}
	if len(labels) > 0 && len(labels) != len(files) {
		return usagef("plot: %d --label values for %d files: give one per file, or none", len(labels), len(files))
	}
	opt := curves.Options{Title: *title, Width: *width, Height: *height, Smoothing: *smooth}
	if *panels != "" {
		if opt.Panels, err = curves.ParsePanels(*panels); err != nil {
			return usageError{err}
		}
	}
	var runs []curves.Run
	for i, f := range files {
		label := strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))
		if len(labels) > 0 {
			label = labels[i]
		}
		got, err := readRuns(f, label, *allPeers)
		if err != nil {
			return err
		}
		runs = append(runs, got...)
	}
	if err := curves.Check(runs, opt); err != nil {
		return usagef("plot: %w", err)
	}
	return writePlot(*out, format, runs, opt)
}

// readRuns reads one metrics file into the runs to plot.
func readRuns(path, label string, allPeers bool) ([]curves.Run, error) {
	recs, err := telemetry.ReadFile(path)
	if err != nil {
		return nil, usagef("plot: %w", err)
	}
	runs := curves.FromRecords(label, recs, allPeers)
	if len(runs) == 0 {
		return nil, usagef("plot: %s has no step records (%d records in all): is it the --metrics-file of a peer that trained?", path, len(recs))
	}
	return runs, nil
}

// writePlot draws the figure into path, removing the file if that fails.
func writePlot(path string, format curves.Format, runs []curves.Run, opt curves.Options) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	err = curves.Write(f, format, runs, opt)
	err = errors.Join(err, f.Close())
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("plot: %s: %w", path, err)
	}
	return nil
}
