// Package codecbench measures every gradient codec of package compress on a
// seeded, heavy-tailed, gradient-like input: compression ratio, encode and
// decode throughput, and the relative error of one step. It backs
// `p2ptrain bench codecs`.
package codecbench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/p2ptrain/p2ptrain/compress"
)

// DefaultSize is the number of float32 values measured when Config.Size is 0 (4 Mi).
const DefaultSize = 4 << 20

// Config selects what Run measures. Zero values pick the defaults.
type Config struct {
	// Size is the number of float32 values (default DefaultSize).
	Size int
	// Repeats is how many timed encodes and decodes each codec gets; the median counts (default 5).
	Repeats int
	// Seed seeds the input and the codecs (default 1).
	Seed uint64
	// Codecs are the spec strings to measure (default compress.Specs()).
	Codecs []string
}

// Result is one codec's measurement.
type Result struct {
	// Codec is the canonical spec string.
	Codec string `json:"codec"`
	// Ratio is fp32 bytes / wire bytes.
	Ratio float64 `json:"ratio"`
	// EncodeGBps is GB/s of fp32 input encoded (median).
	EncodeGBps float64 `json:"encode_gbps"`
	// DecodeGBps is GB/s of fp32 output decoded (median).
	DecodeGBps float64 `json:"decode_gbps"`
	// RelError is ‖decode(encode(g)) − g‖ / ‖g‖ for one step with zero residuals.
	RelError float64 `json:"rel_error"`
}

// Input returns the seeded gradient-like input of n values used by Run: a
// rows×cols matrix (rows = min(1024, √n)) holding a rank-one signal plus
// heavy-tailed noise (Gaussian scaled by a log-normal), around 1e-3 in size.
func Input(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 0x70327472)) // "p2tr"
	rows, cols := shape(n)
	u := make([]float64, rows)
	v := make([]float64, cols)
	for i := range u {
		u[i] = r.NormFloat64()
	}
	for i := range v {
		v[i] = r.NormFloat64()
	}
	g := make([]float32, n)
	for i := range g {
		signal := 0.0
		if i < rows*cols {
			signal = u[i/cols] * v[i%cols]
		}
		noise := r.NormFloat64() * math.Exp(0.75*r.NormFloat64())
		g[i] = float32(1e-3 * (signal + noise))
	}
	return g
}

// shape returns the matrix view of n values: rows = min(1024, ⌊√n⌋), cols = n/rows.
func shape(n int) (rows, cols int) {
	rows = min(1024, int(math.Sqrt(float64(n))))
	if rows == 0 {
		return 0, 0
	}
	return rows, n / rows
}

// layout is the bucket layout used for a codec: low-rank codecs see the matrix
// (and the leftover values as a vector); the others see a flat vector.
func layout(lowRank bool, n int) compress.Layout {
	if !lowRank {
		return compress.FlatLayout(n)
	}
	rows, cols := shape(n)
	l := compress.Layout{Shapes: [][]int{{rows, cols}}}
	if rest := n - rows*cols; rest > 0 {
		l.Shapes = append(l.Shapes, []int{rest})
	}
	return l
}

// Run measures every codec of cfg.
func Run(cfg Config) ([]Result, error) {
	if cfg.Size <= 0 {
		cfg.Size = DefaultSize
	}
	if cfg.Repeats <= 0 {
		cfg.Repeats = 5
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	if len(cfg.Codecs) == 0 {
		cfg.Codecs = compress.Specs()
	}
	g := Input(cfg.Seed, cfg.Size)
	out := make([]float32, len(g))
	var buf []byte
	var rs []Result
	for _, spec := range cfg.Codecs {
		canon, err := compress.Canonical(spec)
		if err != nil {
			return nil, fmt.Errorf("codecbench: %w", err)
		}
		probe, err := compress.New(canon, compress.Options{Layout: compress.FlatLayout(0)})
		if err != nil {
			return nil, fmt.Errorf("codecbench: %w", err)
		}
		opts := compress.Options{Layout: layout(probe.Class() == compress.ClassLowRank, len(g)), Seed: cfg.Seed, SharedSeed: cfg.Seed}
		c, err := compress.New(canon, opts)
		if err != nil {
			return nil, fmt.Errorf("codecbench: %w", err)
		}
		res := Result{Codec: canon}
		// One step from zero residuals: ratio and error.
		if buf, err = c.Encode(buf[:0], g, compress.Pos{Feedback: true}); err != nil {
			return nil, fmt.Errorf("codecbench: %s: %w", canon, err)
		}
		if err := c.Decode(out, buf); err != nil {
			return nil, fmt.Errorf("codecbench: %s: %w", canon, err)
		}
		res.Ratio = float64(4*len(g)) / float64(max(len(buf), 1))
		res.RelError = relError(out, g)
		enc := make([]time.Duration, cfg.Repeats)
		dec := make([]time.Duration, cfg.Repeats)
		for i := range cfg.Repeats {
			t0 := time.Now()
			buf, err = c.Encode(buf[:0], g, compress.Pos{Step: uint64(i + 1), Feedback: true})
			enc[i] = time.Since(t0)
			if err != nil {
				return nil, fmt.Errorf("codecbench: %s: %w", canon, err)
			}
			t0 = time.Now()
			err = c.Decode(out, buf)
			dec[i] = time.Since(t0)
			if err != nil {
				return nil, fmt.Errorf("codecbench: %s: %w", canon, err)
			}
		}
		res.EncodeGBps = gbps(4*len(g), median(enc))
		res.DecodeGBps = gbps(4*len(g), median(dec))
		rs = append(rs, res)
	}
	return rs, nil
}

// relError returns ‖got − want‖ / ‖want‖ (0 for a zero want).
func relError(got, want []float32) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - float64(w)
		num += d * d
		den += float64(w) * float64(w)
	}
	if den == 0 {
		return 0
	}
	return math.Sqrt(num / den)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func gbps(bytes int, d time.Duration) float64 {
	if d <= 0 {
		return math.Inf(1)
	}
	return float64(bytes) / d.Seconds() / 1e9
}

// WriteTable prints the results as an aligned text table.
func WriteTable(w io.Writer, rs []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "codec\tratio\tencode GB/s\tdecode GB/s\trel error\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.2f\t%.4f\t\n", r.Codec, r.Ratio, r.EncodeGBps, r.DecodeGBps, r.RelError)
	}
	return tw.Flush()
}

// WriteJSON prints the results as a JSON list.
func WriteJSON(w io.Writer, rs []Result) error {
	if rs == nil {
		rs = []Result{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rs)
}

// CodingSeconds returns, for every codec of specs (keyed by its canonical
// spec), the seconds per value to encode a buffer of n values and decode
// it once (Run's medians over 5 repeats): what a projection prices a
// coded value at (pipeline.CodecCost.Code).
func CodingSeconds(specs []string, n int) (map[string]float64, error) {
	rs, err := Run(Config{Size: n, Repeats: 5, Codecs: specs})
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64, len(rs))
	for _, r := range rs {
		if !(r.EncodeGBps > 0 && r.DecodeGBps > 0) || math.IsInf(r.EncodeGBps+r.DecodeGBps, 0) {
			return nil, fmt.Errorf("codecbench: %s encoded at %g GB/s and decoded at %g GB/s", r.Codec, r.EncodeGBps, r.DecodeGBps)
		}
		out[r.Codec] = 4e-9/r.EncodeGBps + 4e-9/r.DecodeGBps
	}
	return out, nil
}
