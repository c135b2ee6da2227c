package compress

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// paramDef is one parameter of a codec spec, with its default and a checker
// that returns the canonical spelling of a valid value.
type paramDef struct {
	name, def, help string
	check           func(string) (string, error)
}

// codecDef describes one codec name of the spec language.
type codecDef struct {
	name   string
	params []paramDef
	// build makes the codec from the checked parameters.
	build func(p params, opts Options) (Codec, error)
}

// params holds the canonical parameter values of a parsed spec.
type params struct {
	name  string
	vals  map[string]string
	order []string
	given map[string]bool
}

func (p params) int(k string) int {
	v, _ := strconv.Atoi(p.vals[k])
	return v
}

func (p params) float(k string) float64 {
	v, _ := strconv.ParseFloat(p.vals[k], 64)
	return v
}

func (p params) bool(k string) bool { return p.vals[k] == "true" }

// canonical returns the spec with every parameter spelled out.
func (p params) canonical() string {
	var parts []string
	for _, k := range p.order {
		if k == "momentum" && !p.bool("dgc") {
			continue
		}
		parts = append(parts, k+"="+p.vals[k])
	}
	if len(parts) == 0 {
		return p.name
	}
	return p.name + ":" + strings.Join(parts, ",")
}

func intParam(lo, hi int) func(string) (string, error) {
	return func(s string) (string, error) {
		v, err := strconv.Atoi(s)
		if err != nil || v < lo || v > hi {
			return "", fmt.Errorf("want an integer in [%d, %d]", lo, hi)
		}
		return strconv.Itoa(v), nil
	}
}

func oneOf(vals ...string) func(string) (string, error) {
	return func(s string) (string, error) {
		for _, v := range vals {
			if s == v {
				return s, nil
			}
		}
		return "", fmt.Errorf("want one of %s", strings.Join(vals, ", "))
	}
}

func boolParam(s string) (string, error) {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return "", fmt.Errorf("want true or false")
	}
	return strconv.FormatBool(v), nil
}

// floatParam accepts lo < v <= hi (or lo <= v < hi when closedLow).
func floatParam(lo, hi float64, closedLow bool) func(string) (string, error) {
	return func(s string) (string, error) {
		v, err := strconv.ParseFloat(s, 64)
		ok := err == nil && !math.IsNaN(v) && v <= hi && (v > lo || closedLow && v == lo)
		if closedLow {
			ok = ok && v < hi
		}
		if !ok {
			if closedLow {
				return "", fmt.Errorf("want a number in [%g, %g)", lo, hi)
			}
			return "", fmt.Errorf("want a number in (%g, %g]", lo, hi)
		}
		return strconv.FormatFloat(v, 'g', -1, 64), nil
	}
}

// maxBlock bounds block sizes so that block arithmetic cannot overflow.
const maxBlock = 1 << 24

// maxRank bounds the rank of the low-rank codecs.
const maxRank = 64

func blockParam(def string) paramDef {
	return paramDef{"block", def, "values per scale", intParam(1, maxBlock)}
}

var codecDefs = []codecDef{
	{name: "none", build: buildNone},
	{name: "fp16", build: buildFP16},
	{name: "bf16", build: buildBF16},
	{name: "int8", params: []paramDef{blockParam("2048")}, build: buildInt8},
	{name: "sint8", params: []paramDef{blockParam("2048")}, build: buildSInt8},
	{name: "dyn8", params: []paramDef{blockParam("2048")}, build: buildDyn8},
	{name: "qsgd", params: []paramDef{
		{"bits", "4", "bits per value", oneOf("2", "4", "8")},
		blockParam("512"),
		{"norm", "l2", "block norm", oneOf("l2", "linf")},
	}, build: buildQSGD},
	{name: "onebit", params: []paramDef{blockParam("2048")}, build: buildOneBit},
	{name: "sign", params: []paramDef{blockParam("2048")}, build: buildSign},
	{name: "topk", params: []paramDef{
		{"ratio", "0.01", "fraction of values sent", floatParam(0, 1, false)},
		{"dgc", "false", "DGC momentum correction", boolParam},
		{"momentum", "0.9", "DGC momentum (with dgc=true)", floatParam(0, 1, true)},
	}, build: buildTopK},
	{name: "powersgd", params: []paramDef{
		{"rank", "4", "rank of the factors", intParam(1, maxRank)},
	}, build: buildPowerSGD},
	{name: "acpsgd", params: []paramDef{
		{"rank", "4", "rank of the factors", intParam(1, maxRank)},
	}, build: buildACPSGD},
}

func codecNames() string {
	names := make([]string, len(codecDefs))
	for i, d := range codecDefs {
		names[i] = d.name
	}
	return strings.Join(names, ", ")
}

// parseSpec parses and checks a spec string.
func parseSpec(spec string) (*codecDef, params, error) {
	s := strings.ToLower(strings.TrimSpace(spec))
	name, rest, hasParams := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if name == "fp32" {
		name = "none" // fp32 is what "none" sends; both names are accepted
	}
	var def *codecDef
	for i := range codecDefs {
		if codecDefs[i].name == name {
			def = &codecDefs[i]
		}
	}
	if def == nil {
		return nil, params{}, fmt.Errorf("compress: unknown codec %q in spec %q (valid: %s)", name, spec, codecNames())
	}
	p := params{name: name, vals: map[string]string{}, given: map[string]bool{}}
	valid := make([]string, len(def.params))
	for i, pd := range def.params {
		p.vals[pd.name] = pd.def
		p.order = append(p.order, pd.name)
		valid[i] = pd.name + " (" + pd.help + ", default " + pd.def + ")"
	}
	if hasParams {
		for _, kv := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(kv, "=")
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			var pd *paramDef
			for i := range def.params {
				if def.params[i].name == k {
					pd = &def.params[i]
				}
			}
			switch {
			case pd == nil && len(def.params) == 0:
				return nil, params{}, fmt.Errorf("compress: codec %s takes no parameters, got %q", name, kv)
			case pd == nil && k == "bucket":
				return nil, params{}, fmt.Errorf("compress: codec %s: parameter \"bucket\" is now called \"block\" (values per scale): use block=%s",
					name, v)
			case pd == nil:
				return nil, params{}, fmt.Errorf("compress: unknown parameter %q for codec %s (valid: %s)",
					k, name, strings.Join(valid, "; "))
			case !ok:
				return nil, params{}, fmt.Errorf("compress: parameter %s of codec %s has no value", k, name)
			case p.given[k]:
				return nil, params{}, fmt.Errorf("compress: parameter %s of codec %s given twice", k, name)
			}
			c, err := pd.check(v)
			if err != nil {
				return nil, params{}, fmt.Errorf("compress: codec %s: bad %s=%q: %v", name, k, v, err)
			}
			p.vals[k] = c
			p.given[k] = true
		}
	}
	if p.given["momentum"] && !p.bool("dgc") {
		return nil, params{}, fmt.Errorf("compress: codec %s: momentum needs dgc=true", name)
	}
	return def, p, nil
}

// Validate checks a spec string without building a codec (for config loading).
func Validate(spec string) error {
	_, _, err := parseSpec(spec)
	return err
}

// Canonical returns the canonical form of a valid spec, every parameter spelled out.
func Canonical(spec string) (string, error) {
	_, p, err := parseSpec(spec)
	if err != nil {
		return "", err
	}
	return p.canonical(), nil
}

// Specs returns the canonical spec of every codec with default parameters.
func Specs() []string {
	out := make([]string, len(codecDefs))
	for i := range codecDefs {
		_, p, _ := parseSpec(codecDefs[i].name)
		out[i] = p.canonical()
	}
	return out
}

// New builds a codec instance from a spec string for the bucket described by opts.Layout.
func New(spec string, opts Options) (Codec, error) {
	def, p, err := parseSpec(spec)
	if err != nil {
		return nil, err
	}
	for i, s := range opts.Layout.Shapes {
		for _, d := range s {
			if d < 0 {
				return nil, fmt.Errorf("compress: tensor %d has shape %v: %w", i, s, ErrShape)
			}
		}
	}
	total := 0
	for _, s := range opts.Layout.Shapes {
		n := 1
		for _, d := range s {
			if d != 0 && n > math.MaxInt32/d {
				return nil, fmt.Errorf("compress: tensor of shape %v is too large: %w", s, ErrShape)
			}
			n *= d
		}
		total += n
		if total > math.MaxInt32 {
			return nil, fmt.Errorf("compress: layout of more than %d values: %w", math.MaxInt32, ErrShape)
		}
	}
	return def.build(p, opts)
}
