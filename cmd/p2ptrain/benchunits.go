package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Quantities on the bench command lines.
//
// Sizes: a number with an optional suffix. K, M, G, T and Ki, Mi, Gi, Ti are
// binary (1024-based, as in nccl-tests: 64M = 64Mi); in byte sizes KiB, MiB,
// GiB, TiB are binary too and kB, KB, MB, GB, TB are decimal; a plain B means
// bytes. Counts take the same suffixes without a B.
//
// Rates: a number with a unit in bits per second, as tc writes them: bit,
// kbit, mbit, gbit, tbit (1000-based), optionally followed by "/s"; "0" or
// "unlimited" means no limit.

// sizeUnits maps a size suffix to its multiplier; bytesOnly suffixes are
// refused for counts.
var sizeUnits = []struct {
	suffix    string
	mult      float64
	bytesOnly bool
}{
	{"", 1, false},
	{"B", 1, true},
	{"K", 1 << 10, false}, {"k", 1 << 10, false}, {"Ki", 1 << 10, false}, {"ki", 1 << 10, false},
	{"M", 1 << 20, false}, {"Mi", 1 << 20, false},
	{"G", 1 << 30, false}, {"Gi", 1 << 30, false},
	{"T", 1 << 40, false}, {"Ti", 1 << 40, false},
	{"KiB", 1 << 10, true}, {"kiB", 1 << 10, true}, {"MiB", 1 << 20, true}, {"GiB", 1 << 30, true}, {"TiB", 1 << 40, true},
	{"kB", 1e3, true}, {"KB", 1e3, true}, {"MB", 1e6, true}, {"GB", 1e9, true}, {"TB", 1e12, true},
}

// splitNumber splits s into its leading decimal number and the rest.
func splitNumber(s string) (num, unit string) {
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	return s[:i], strings.TrimSpace(s[i:])
}

// parseQuantity parses a size (bytes true) or a count (bytes false).
func parseQuantity(s string, bytes bool) (int, error) {
	what, example := "count", "4096 or 4Mi"
	if bytes {
		what, example = "size", "4096, 4MiB or 1GiB"
	}
	num, unit := splitNumber(strings.TrimSpace(s))
	if num == "" {
		return 0, fmt.Errorf("invalid %s %q (want e.g. %s)", what, s, example)
	}
	x, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid %s %q (want e.g. %s)", what, s, example)
	}
	for _, u := range sizeUnits {
		if u.suffix != unit || (u.bytesOnly && !bytes) {
			continue
		}
		v := x * u.mult
		if v != math.Trunc(v) {
			return 0, fmt.Errorf("%s %q is not a whole number", what, s)
		}
		if v > math.MaxInt32*4 {
			return 0, fmt.Errorf("%s %q is too large", what, s)
		}
		return int(v), nil
	}
	return 0, fmt.Errorf("invalid %s %q: unknown unit %q (want e.g. %s)", what, s, unit, example)
}

// parseRate parses one link rate and returns it in bytes per second (0: unlimited).
func parseRate(s string) (float64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "unlimited" || t == "0" {
		return 0, nil
	}
	num, unit := splitNumber(t)
	unit = strings.TrimSuffix(unit, "/s")
	mult := map[string]float64{"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}[unit]
	x, err := strconv.ParseFloat(num, 64)
	if num == "" || err != nil || mult == 0 || x < 0 || math.IsInf(x, 0) {
		return 0, fmt.Errorf("invalid rate %q (want e.g. 100mbit, 1gbit or unlimited)", s)
	}
	return x * mult / 8, nil
}

// sizeFlag is a flag.Value holding a byte size or a value count.
type sizeFlag struct {
	n     int
	bytes bool
}

func (f *sizeFlag) String() string {
	if f == nil {
		return ""
	}
	return formatQuantity(f.n, f.bytes)
}

// formatQuantity writes n the way parseQuantity reads it (64MiB, 4Mi, 4096).
func formatQuantity(n int, bytes bool) string {
	suffix := ""
	if bytes {
		suffix = "B"
	}
	for _, u := range []struct {
		name  string
		shift uint
	}{{"Gi", 30}, {"Mi", 20}, {"Ki", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.Itoa(n>>u.shift) + u.name + suffix
		}
	}
	return strconv.Itoa(n)
}

func (f *sizeFlag) Set(s string) error {
	n, err := parseQuantity(s, f.bytes)
	if err != nil {
		return err
	}
	f.n = n
	return nil
}

// rateValue is a flag.Value holding one rate in bytes/s (0: not given).
type rateValue struct{ rate float64 }

func (f *rateValue) String() string {
	if f == nil || f.rate == 0 {
		return ""
	}
	return formatRate(f.rate)
}

func (f *rateValue) Set(s string) (err error) {
	f.rate, err = parseRate(s)
	return err
}

// rateFlag is a flag.Value holding one rate or a comma-separated rate per peer (bytes/s).
type rateFlag struct{ rates []float64 }

func (f *rateFlag) String() string {
	if f == nil {
		return ""
	}
	parts := make([]string, len(f.rates))
	for i, r := range f.rates {
		parts[i] = formatRate(r)
	}
	return strings.Join(parts, ",")
}

func (f *rateFlag) Set(s string) error {
	f.rates = f.rates[:0]
	for part := range strings.SplitSeq(s, ",") {
		r, err := parseRate(part)
		if err != nil {
			return err
		}
		f.rates = append(f.rates, r)
	}
	return nil
}

// formatRate writes a rate in bytes/s the way parseRate reads it.
func formatRate(bytesPerS float64) string {
	if bytesPerS <= 0 {
		return "unlimited"
	}
	bits := bytesPerS * 8
	for _, u := range []struct {
		name string
		mult float64
	}{{"tbit", 1e12}, {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}} {
		if bits >= u.mult {
			return strconv.FormatFloat(bits/u.mult, 'g', -1, 64) + u.name
		}
	}
	return strconv.FormatFloat(bits, 'g', -1, 64) + "bit"
}
