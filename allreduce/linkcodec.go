package allreduce

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/p2ptrain/p2ptrain/compress"
)

// LinkSpec returns the codec spec to use on a link that is slowdown times
// slower than the fastest link (slowdown ≥ 1), staying within spec's codec
// family: none → fp16 (slowdown ≥ 1.5); qsgd bits 8 → 4 → 2 (halving the
// bits per 2× slowdown); topk ratio divided by the slowdown (at least 1e-4);
// other codecs are returned unchanged. The result is canonical.
func LinkSpec(spec string, slowdown float64) (string, error) {
	c, err := compress.Canonical(spec)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if !(slowdown > 1) {
		return c, nil
	}
	name, rest, _ := strings.Cut(c, ":")
	params := []string{}
	if rest != "" {
		params = strings.Split(rest, ",")
	}
	set := func(k, v string) {
		for i, p := range params {
			if strings.HasPrefix(p, k+"=") {
				params[i] = k + "=" + v
			}
		}
	}
	get := func(k string) string {
		for _, p := range params {
			if v, ok := strings.CutPrefix(p, k+"="); ok {
				return v
			}
		}
		return ""
	}
	switch name {
	case "none":
		if slowdown >= 1.5 {
			return compress.Canonical("fp16")
		}
		return c, nil
	case "qsgd":
		bits, _ := strconv.Atoi(get("bits"))
		for _, b := range []int{2, 4, 8} {
			if b <= bits && float64(bits)/float64(b) <= slowdown*1.0001 {
				set("bits", strconv.Itoa(b))
				break
			}
		}
	case "topk":
		r, _ := strconv.ParseFloat(get("ratio"), 64)
		set("ratio", strconv.FormatFloat(max(1e-4, r/slowdown), 'g', 4, 64))
	default:
		return c, nil
	}
	return compress.Canonical(name + ":" + strings.Join(params, ","))
}

// LinkSpecs returns, for ring order o over matrix m, the spec of each ring
// edge k (from o[k] to o[k+1]): LinkSpec with the edge's slowdown against the
// ring's fastest edge. override, when non-empty, is used on every edge.
//
// The ring schedule may encode each reduce-scatter hop with its edge's
// codec; the all-gather must ship one encoding to every peer and uses the
// spec of the slowest edge.
func LinkSpecs(spec string, m Matrix, o []int, override string) ([]string, error) {
	out := make([]string, len(o))
	if override != "" {
		c, err := compress.Canonical(override)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		for k := range out {
			out[k] = c
		}
		return out, nil
	}
	fast := 0.0
	for k := range o {
		fast = max(fast, m.at(o[k], o[(k+1)%len(o)]))
	}
	for k := range o {
		e := m.at(o[k], o[(k+1)%len(o)])
		slow := 1.0
		if e > 0 {
			slow = fast / e
		}
		s, err := LinkSpec(spec, slow)
		if err != nil {
			return nil, err
		}
		out[k] = s
	}
	return out, nil
}
