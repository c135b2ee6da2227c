// Per-link codecs: which codec each ring edge carries, from its measured
// speed, and the predicted ring time with them.

package plan

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/compress"
)

// EdgeCodec returns the codec spec to use on a link that is slowdown times
// slower than the fastest link (slowdown ≥ 1), staying within spec's codec
// family: none → fp16 (slowdown ≥ 1.5); qsgd bits 8 → 4 → 2 (halving the
// bits per 2× slowdown); topk ratio divided by the slowdown (at least 1e-4);
// other codecs are returned unchanged. The result is canonical.
func EdgeCodec(spec string, slowdown float64) (string, error) {
	c, err := compress.Canonical(spec)
	if err != nil {
		return "", fmt.Errorf("%w: %w", allreduce.ErrConfig, err)
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
		if slowdown >= SlowLink {
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

// SlowLink is the slowdown against a ring's fastest edge from which EdgeCodec
// moves fp32 to fp16 and a EdgeCodecs override applies.
const SlowLink = 1.5

// EdgeCodecs returns, for ring order o over matrix m, the spec of each ring
// edge k (from o[k] to o[k+1]) and the spec of the all-gather. Each edge gets
// EdgeCodec with its slowdown against the ring's fastest edge; override, when
// non-empty, is used instead on every edge at least SlowLink times slower
// than the fastest. The all-gather must ship one encoding to every peer and
// uses the spec of the slowest edge. Unknown (zero) edges count as fast.
func EdgeCodecs(spec string, m Matrix, o []int, override string) (edges []string, final string, err error) {
	if override != "" {
		if override, err = compress.Canonical(override); err != nil {
			return nil, "", fmt.Errorf("%w: %w", allreduce.ErrConfig, err)
		}
	}
	fast, slowest := 0.0, -1
	for k := range o {
		e := m.at(o[k], o[(k+1)%len(o)])
		fast = max(fast, e)
		if e > 0 && (slowest < 0 || e < m.at(o[slowest], o[(slowest+1)%len(o)])) {
			slowest = k
		}
	}
	edges = make([]string, len(o))
	for k := range o {
		slow := 1.0
		if e := m.at(o[k], o[(k+1)%len(o)]); e > 0 {
			slow = fast / e
		}
		if override != "" && slow >= SlowLink {
			edges[k] = override
			continue
		}
		if edges[k], err = EdgeCodec(spec, slow); err != nil {
			return nil, "", err
		}
	}
	if slowest < 0 {
		final, err = compress.Canonical(spec)
		if err != nil {
			return nil, "", fmt.Errorf("%w: %w", allreduce.ErrConfig, err)
		}
		return edges, final, nil
	}
	return edges, edges[slowest], nil
}

// fractionElems is the bucket over which EncodedFraction measures a codec.
const fractionElems = 1 << 16

// EncodedFraction returns the size of spec's encoding of a large bucket as
// a fraction of its fp32 bytes (1 for none, about 0.5 for fp16).
func EncodedFraction(spec string) (float64, error) {
	c, err := compress.New(spec, compress.Options{Layout: compress.FlatLayout(fractionElems)})
	if err != nil {
		return 0, fmt.Errorf("%w: %w", allreduce.ErrConfig, err)
	}
	return float64(c.MaxEncodedLen(fractionElems)) / (4 * fractionElems), nil
}

// LinkRingSeconds predicts the ring schedule's time for a bucket of bytes
// fp32 bytes in order o when edge k (o[k] → o[k+1]) carries reduce-scatter
// payloads at frac[k] of their fp32 size and the all-gather at final: each
// phase moves (W−1)/W of the bytes through every edge, paced by the edge
// slowest to carry its share. With every fraction 1 it is RingSeconds.
func LinkRingSeconds(m Matrix, o []int, bytes float64, frac []float64, final float64) float64 {
	w := len(o)
	if w < 2 {
		return 0
	}
	rs, ag := 0.0, 0.0
	for k := range o {
		b := m.at(o[k], o[(k+1)%w])
		rs, ag = math.Max(rs, frac[k]/b), math.Max(ag, final/b)
	}
	return float64(w-1) / float64(w) * bytes * (rs + ag)
}

// LinkPlanSeconds predicts the ring time, for a bucket of bytes fp32 bytes
// in order o over m, of the per-link codecs edges and final (EdgeCodecs'
// results), each link's bytes scaled by its codec's encoded size against
// spec's: spec's own ring time times what the smaller encodings save.
func LinkPlanSeconds(m Matrix, o []int, bytes float64, spec string, edges []string, final string) (float64, error) {
	base, err := EncodedFraction(spec)
	if err != nil {
		return 0, err
	}
	if len(edges) != len(o) || !(base > 0) {
		return 0, fmt.Errorf("%w: %d per-link codecs for a ring of %d", allreduce.ErrConfig, len(edges), len(o))
	}
	frac := make([]float64, len(o))
	for k, e := range edges {
		f, err := EncodedFraction(e)
		if err != nil {
			return 0, err
		}
		frac[k] = f / base
	}
	fin, err := EncodedFraction(final)
	if err != nil {
		return 0, err
	}
	return LinkRingSeconds(m, o, bytes, frac, fin/base), nil
}

// ChooseLinks is Choose for a canonical codec spec with per-link variants
// (CanonicalLinkCodec): when Choose picks proportional shares but the ring with
// EdgeCodecs' codecs (override as there) is predicted faster, it returns that
// ring instead. edges and final are the per-link codecs of the returned
// ring, nil and "" when every link would use spec or the plan is
// proportional.
func ChooseLinks(m Matrix, bytes int, spec, override string) (p Choice, edges []string, final string, err error) {
	p = Choose(m, bytes)
	if len(p.Order) < 2 {
		return p, nil, "", nil
	}
	if edges, final, err = EdgeCodecs(spec, m, p.Order, override); err != nil {
		return p, nil, "", err
	}
	if final == spec && !slices.ContainsFunc(edges, func(e string) bool { return e != spec }) {
		return p, nil, "", nil
	}
	if p.Schedule == allreduce.ScheduleProportional {
		t, err := LinkPlanSeconds(m, p.Order, float64(bytes), spec, edges, final)
		if err != nil {
			return p, nil, "", err
		}
		if t >= p.ProportionalSeconds {
			return p, nil, "", nil
		}
		p.Schedule, p.Shares = allreduce.ScheduleRing, nil
	}
	return p, edges, final, nil
}
