// Package curves draws training curves from metrics files (JSON Lines of
// telemetry records, as `p2ptrain join --metrics-file` writes them) so that
// runs can be compared: training loss against step, the held-out metric
// against step, and training loss against wall time, one colour per run.
package curves

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/p2ptrain/p2ptrain/telemetry"
)

// Run is one curve's data: a name for the legend and the run's records in
// the order they were made.
type Run struct {
	Name    string
	Records []telemetry.Record
}

// Panel names one panel of the figure.
type Panel string

// The panels, in the order Options.Panels defaults to.
const (
	// PanelLoss is the training loss against the step.
	PanelLoss Panel = "loss"
	// PanelEval is the test accuracy against the step, or held-out bits
	// per byte when evaluation records carry them.
	PanelEval Panel = "eval"
	// PanelTime is the training loss against wall time since the run's
	// first record.
	PanelTime Panel = "time"
)

// Panels lists every panel, in the default order.
var Panels = []Panel{PanelLoss, PanelEval, PanelTime}

// ParsePanels reads a comma-separated list of panel names.
func ParsePanels(s string) ([]Panel, error) {
	var out []Panel
	for name := range strings.SplitSeq(s, ",") {
		p := Panel(strings.TrimSpace(name))
		if !p.valid() {
			return nil, fmt.Errorf("curves: unknown panel %q (want loss, eval or time)", name)
		}
		out = append(out, p)
	}
	return out, nil
}

func (p Panel) valid() bool { return p == PanelLoss || p == PanelEval || p == PanelTime }

// Format is an output image format.
type Format string

// The formats Write can produce.
const (
	SVG Format = "svg"
	PNG Format = "png"
)

// FormatOf returns the format a file name's extension asks for.
func FormatOf(path string) (Format, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".svg":
		return SVG, nil
	case ".png":
		return PNG, nil
	case "":
		return "", fmt.Errorf("curves: %s has no extension: name it .svg or .png", path)
	default:
		return "", fmt.Errorf("curves: %s: unknown image format %q (want .svg or .png)", path, ext)
	}
}

// Default figure size: PanelWidth pixels per panel, Height pixels high.
const (
	PanelWidth = 420
	Height     = 380
)

// DefaultSmoothing is the smoothing p2ptrain plot uses unless told otherwise.
const DefaultSmoothing = 0.9

// Options shape the figure. The zero value draws every panel that has
// data, unsmoothed, at the default size.
type Options struct {
	// Title is printed above the panels when not empty.
	Title string
	// Width and Height are the image's size in pixels (CSS pixels for
	// SVG, 96 per inch); zero picks PanelWidth per panel and Height.
	Width, Height int
	// Smoothing is the weight of the past in the exponential moving
	// average drawn over the training loss: s₀ = loss₀,
	// sᵢ = Smoothing·sᵢ₋₁ + (1−Smoothing)·lossᵢ. The raw loss is drawn
	// beneath it as a thin line. 0 draws the raw loss alone; it must be
	// in [0, 1).
	Smoothing float64
	// Panels picks the panels, left to right. Empty: every panel, less
	// the evaluation panel when no run has evaluation records and the
	// time panel when no step record carries a time. A panel asked for
	// by name that has no data is an error.
	Panels []Panel
}

// ptPerPx converts pixels at 96 per inch to the 72 points per inch vg uses.
const ptPerPx = 72.0 / 96

// Check reports what Write would refuse in runs and opt, the image aside:
// no runs, a run without loss values, a panel without data, options out
// of range.
func Check(runs []Run, opt Options) error {
	_, _, _, err := layout(runs, opt)
	return err
}

// layout returns the panels to draw and the image size in pixels.
func layout(runs []Run, opt Options) (panels []Panel, width, height int, err error) {
	panels, err = choosePanels(runs, opt.Panels)
	if err != nil {
		return nil, 0, 0, err
	}
	if opt.Smoothing < 0 || opt.Smoothing >= 1 || math.IsNaN(opt.Smoothing) {
		return nil, 0, 0, fmt.Errorf("curves: smoothing %v must be in [0, 1)", opt.Smoothing)
	}
	width, height = opt.Width, opt.Height
	if width == 0 {
		width = PanelWidth * len(panels)
	}
	if height == 0 {
		height = Height
	}
	if width < 100 || height < 100 || width > 20000 || height > 20000 {
		return nil, 0, 0, fmt.Errorf("curves: image size %dx%d pixels is outside 100..20000", width, height)
	}
	return panels, width, height, nil
}

// Write draws the runs and writes the image in format f to w.
func Write(w io.Writer, f Format, runs []Run, opt Options) error {
	panels, width, height, err := layout(runs, opt)
	if err != nil {
		return err
	}
	wl, hl := vg.Length(float64(width)*ptPerPx), vg.Length(float64(height)*ptPerPx)
	var c vg.CanvasWriterTo
	switch f {
	case SVG:
		c = vgsvg.New(wl, hl)
	case PNG:
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(wl, hl), vgimg.UseDPI(96))}
	default:
		return fmt.Errorf("curves: unknown image format %q (want svg or png)", f)
	}
	if err := drawFigure(draw.New(c), runs, panels, opt); err != nil {
		return err
	}
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("curves: writing the %s image: %w", f, err)
	}
	return nil
}

// series is one run's data, reduced to what the panels draw.
type series struct {
	name   string
	colour color.RGBA
	// loss: (step, loss) and (seconds since the first record, loss).
	loss, lossTime plotter.XYs
	// eval: (step, accuracy in % or bits per byte).
	eval plotter.XYs
	done bool
}

// evalMetric says what the evaluation panel shows.
type evalMetric int

const (
	metricAccuracy evalMetric = iota
	metricBitsPerByte
)

// extract reduces a run's records to its series. Event records other than
// "done" are ignored.
func extract(r Run, metric evalMetric) series {
	s := series{name: r.Name}
	var t0 float64
	haveT0 := false
	for _, rec := range r.Records {
		if !rec.Time.IsZero() && !haveT0 {
			t0, haveT0 = float64(rec.Time.UnixNano())/1e9, true
		}
		switch rec.Kind {
		case telemetry.KindStep:
			if !finite(rec.Loss) {
				continue
			}
			s.loss = append(s.loss, plotter.XY{X: float64(rec.Step), Y: rec.Loss})
			if !rec.Time.IsZero() {
				s.lossTime = append(s.lossTime, plotter.XY{X: float64(rec.Time.UnixNano())/1e9 - t0, Y: rec.Loss})
			}
		case telemetry.KindEval:
			v := rec.Accuracy
			if metric == metricBitsPerByte {
				v = rec.BitsPerByte
			}
			if v == nil || !finite(*v) {
				continue
			}
			y := *v
			if metric == metricAccuracy {
				y *= 100
			}
			s.eval = append(s.eval, plotter.XY{X: float64(rec.Step), Y: y})
		case telemetry.KindEvent:
			if rec.Event == telemetry.EventDone {
				s.done = true
			}
		}
	}
	return s
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// metricOf picks the evaluation panel's metric: bits per byte if any
// evaluation record carries them, else accuracy.
func metricOf(runs []Run) evalMetric {
	for _, r := range runs {
		for _, rec := range r.Records {
			if rec.Kind == telemetry.KindEval && rec.BitsPerByte != nil {
				return metricBitsPerByte
			}
		}
	}
	return metricAccuracy
}

// choosePanels checks the runs and returns the panels to draw.
func choosePanels(runs []Run, asked []Panel) ([]Panel, error) {
	if len(runs) == 0 {
		return nil, errors.New("curves: no runs to plot")
	}
	metric := metricOf(runs)
	has := map[Panel]bool{}
	for _, r := range runs {
		s := extract(r, metric)
		if len(s.loss) == 0 {
			return nil, fmt.Errorf("curves: run %q has no step records with a loss", r.Name)
		}
		has[PanelLoss] = true
		has[PanelEval] = has[PanelEval] || len(s.eval) > 0
		has[PanelTime] = has[PanelTime] || len(s.lossTime) > 0
	}
	if len(asked) == 0 {
		var out []Panel
		for _, p := range Panels {
			if has[p] {
				out = append(out, p)
			}
		}
		return out, nil
	}
	for _, p := range asked {
		if !p.valid() {
			return nil, fmt.Errorf("curves: unknown panel %q (want loss, eval or time)", p)
		}
		if !has[p] {
			return nil, fmt.Errorf("curves: no run has data for the %s panel", p)
		}
	}
	return asked, nil
}

// palette: distinct colours that stay apart for colour-blind readers
// (blue, orange, bluish green, vermilion, reddish purple, sky blue, yellow,
// black); runs past the eighth reuse them in order.
var palette = []color.RGBA{
	{0x00, 0x72, 0xb2, 0xff},
	{0xe6, 0x9f, 0x00, 0xff},
	{0x00, 0x9e, 0x73, 0xff},
	{0xd5, 0x5e, 0x00, 0xff},
	{0xcc, 0x79, 0xa7, 0xff},
	{0x56, 0xb4, 0xe9, 0xff},
	{0xf0, 0xe4, 0x42, 0xff},
	{0x00, 0x00, 0x00, 0xff},
}

// faded is c at a quarter of its opacity (premultiplied), for raw curves.
func faded(c color.RGBA) color.RGBA {
	return color.RGBA{c.R / 4, c.G / 4, c.B / 4, c.A / 4}
}

// Text sizes in points.
const (
	titleSize  = 13
	labelSize  = 10.5
	tickSize   = 9
	legendSize = 10
)

var sans = font.Font{Typeface: "Liberation", Variant: "Sans"}

// drawFigure draws the whole figure on dc.
func drawFigure(dc draw.Canvas, runs []Run, panels []Panel, opt Options) error {
	metric := metricOf(runs)
	ss := make([]series, len(runs))
	for i, r := range runs {
		ss[i] = extract(r, metric)
		ss[i].colour = palette[i%len(palette)]
	}
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())

	pad := vg.Points(6)
	area := draw.Crop(dc, pad, -pad, pad, -pad)
	if opt.Title != "" {
		sty := textStyle(titleSize)
		sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
		area.FillText(sty, vg.Point{X: (area.Min.X + area.Max.X) / 2, Y: area.Max.Y}, opt.Title)
		area = draw.Crop(area, 0, 0, 0, -(sty.Height(opt.Title) + pad))
	}

	// The legend: a column on the right, one entry per run.
	leg := plot.NewLegend()
	leg.TextStyle = textStyle(legendSize)
	leg.Top, leg.Left = true, true
	leg.Padding = vg.Points(3)
	for _, s := range ss {
		leg.Add(s.name, smoothLine(nil, s.colour))
	}
	lw := leg.Rectangle(area).Size().X
	leg.Draw(draw.Crop(area, area.Size().X-lw, 0, 0, -vg.Points(24)))
	area = draw.Crop(area, 0, -(lw + 2*pad), 0, 0)

	row := make([]*plot.Plot, len(panels))
	for i, p := range panels {
		pl, err := panel(p, ss, metric, opt.Smoothing)
		if err != nil {
			return err
		}
		row[i] = pl
	}
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: 3 * pad}
	canvases := plot.Align([][]*plot.Plot{row}, tiles, area)
	for i, pl := range row {
		pl.Draw(canvases[0][i])
	}
	return nil
}

func textStyle(size vg.Length) text.Style {
	return text.Style{Color: color.Black, Font: font.From(sans, size), Handler: plot.DefaultTextHandler}
}

// smoothLine is a line in a run's colour, at the width of its main curve.
func smoothLine(xys plotter.XYs, c color.Color) *plotter.Line {
	return &plotter.Line{XYs: xys, LineStyle: draw.LineStyle{Color: c, Width: vg.Points(1.5)}}
}

// panel builds one panel's plot.
func panel(p Panel, ss []series, metric evalMetric, smoothing float64) (*plot.Plot, error) {
	pl := plot.New()
	for _, ax := range []*plot.Axis{&pl.X, &pl.Y} {
		ax.Label.TextStyle.Font = font.From(sans, labelSize)
		ax.Tick.Label.Font = font.From(sans, tickSize)
	}
	pl.Add(&plotter.Grid{
		Vertical:   draw.LineStyle{Color: color.Gray{0xe0}, Width: vg.Points(0.5)},
		Horizontal: draw.LineStyle{Color: color.Gray{0xe0}, Width: vg.Points(0.5)},
	})
	switch p {
	case PanelLoss:
		pl.X.Label.Text = "step"
		pl.Y.Label.Text = "training loss (nats)"
		for _, s := range ss {
			addLoss(pl, s.loss, s, smoothing)
		}
	case PanelTime:
		unit, div := timeUnit(ss)
		pl.X.Label.Text = "wall time since start (" + unit + ")"
		pl.Y.Label.Text = "training loss (nats)"
		for _, s := range ss {
			xys := make(plotter.XYs, len(s.lossTime))
			for i, xy := range s.lossTime {
				xys[i] = plotter.XY{X: xy.X / div, Y: xy.Y}
			}
			addLoss(pl, xys, s, smoothing)
		}
	case PanelEval:
		pl.X.Label.Text = "step"
		pl.Y.Label.Text = "test accuracy (%)"
		if metric == metricBitsPerByte {
			pl.Y.Label.Text = "held-out bits per byte"
		}
		for _, s := range ss {
			if len(s.eval) == 0 {
				continue
			}
			l := smoothLine(s.eval, s.colour)
			pts := &plotter.Scatter{XYs: s.eval, GlyphStyle: draw.GlyphStyle{Color: s.colour, Radius: vg.Points(2.2), Shape: draw.CircleGlyph{}}}
			pl.Add(l, pts)
		}
	default:
		return nil, fmt.Errorf("curves: unknown panel %q", p)
	}
	pl.X.Min = 0 // steps and time count from the start of the run
	return pl, nil
}

// addLoss draws a loss curve: the raw values thin and faded under their
// moving average, and a ring at the end of a run that finished.
func addLoss(pl *plot.Plot, xys plotter.XYs, s series, smoothing float64) {
	if len(xys) == 0 {
		return
	}
	c := s.colour
	main := xys
	if smoothing > 0 {
		pl.Add(&plotter.Line{XYs: xys, LineStyle: draw.LineStyle{Color: faded(c), Width: vg.Points(0.6)}})
		main = ema(xys, smoothing)
	}
	pl.Add(smoothLine(main, c))
	if s.done {
		last := main[len(main)-1:]
		pl.Add(&plotter.Scatter{XYs: last, GlyphStyle: draw.GlyphStyle{Color: c, Radius: vg.Points(3), Shape: draw.RingGlyph{}}})
	}
}

// ema is the exponential moving average of the Y values, w the weight of
// the past: s₀ = y₀, sᵢ = w·sᵢ₋₁ + (1−w)·yᵢ.
func ema(xys plotter.XYs, w float64) plotter.XYs {
	out := make(plotter.XYs, len(xys))
	s := xys[0].Y
	for i, xy := range xys {
		if i > 0 {
			s = w*s + (1-w)*xy.Y
		}
		out[i] = plotter.XY{X: xy.X, Y: s}
	}
	return out
}

// timeUnit picks the wall-time axis's unit from the longest run: seconds
// up to 3 minutes, minutes up to 3 hours, hours beyond.
func timeUnit(ss []series) (name string, seconds float64) {
	longest := 0.0
	for _, s := range ss {
		for _, xy := range s.lossTime {
			longest = max(longest, xy.X)
		}
	}
	switch {
	case longest <= 180:
		return "s", 1
	case longest <= 3*3600:
		return "min", 60
	default:
		return "h", 3600
	}
}

// FromRecords splits the records of one metrics file into runs by their
// Run field, in the order the names first appear, keeping those with at
// least one step record. With allPeers false it keeps only the first such
// run and names it label; otherwise each is named label/run (label alone
// for records that name no run).
func FromRecords(label string, recs []telemetry.Record, allPeers bool) []Run {
	var names []string
	byName := map[string][]telemetry.Record{}
	steps := map[string]bool{}
	for _, r := range recs {
		if _, ok := byName[r.Run]; !ok {
			names = append(names, r.Run)
		}
		byName[r.Run] = append(byName[r.Run], r)
		steps[r.Run] = steps[r.Run] || r.Kind == telemetry.KindStep
	}
	var out []Run
	for _, n := range names {
		if !steps[n] {
			continue
		}
		if !allPeers {
			return []Run{{Name: label, Records: byName[n]}}
		}
		name := label
		if n != "" {
			name = label + "/" + n
		}
		out = append(out, Run{Name: name, Records: byName[n]})
	}
	return out
}
