package bridge

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/p2ptrain/p2ptrain/compress"
	"github.com/p2ptrain/p2ptrain/train"
)

// Limits on what a process may register.
const (
	maxParams      = 1 << 20 // tensors
	maxValues      = 1 << 30 // float32 values in all (4 GiB of gradients)
	maxSettings    = 256
	maxSettingLen  = 1024
	maxNameLen     = 512
	settingsPrefix = "external."
)

// LayoutKey is the cluster setting that summarises a process's layout.
const LayoutKey = settingsPrefix + "layout"

// ErrLayout: a registered layout or settings the daemon refuses.
var ErrLayout = errors.New("bridge: layout refused")

var (
	settingKey = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,128}$`)
	hexHash    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// layout is a process's registered parameters, grouped into buckets.
type layout struct {
	buckets []compress.Layout // each bucket's tensor shapes, for the codecs
	offsets []int             // each bucket's first value in the flat order
	sizes   []int             // each bucket's number of values
	n       int               // values in all
	digest  [32]byte          // of the names, shapes and buckets
	tensors int
	desc    []byte // Description, for a peer whose layout differs
}

// parseLayout checks a hello's params and buckets: float32 tensors with
// at least one value, unique names, every tensor in exactly one bucket.
func parseLayout(params []param, buckets [][]int) (*layout, error) {
	if len(params) == 0 || len(params) > maxParams {
		return nil, fmt.Errorf("%w: %d parameters (1 to %d)", ErrLayout, len(params), maxParams)
	}
	if len(buckets) == 0 {
		return nil, fmt.Errorf("%w: no buckets", ErrLayout)
	}
	names := make(map[string]bool, len(params))
	numel := make([]int, len(params))
	for i, p := range params {
		switch {
		case p.Name == "" || len(p.Name) > maxNameLen:
			return nil, fmt.Errorf("%w: parameter %d has no name or one longer than %d bytes", ErrLayout, i, maxNameLen)
		case names[p.Name]:
			return nil, fmt.Errorf("%w: parameter name %q appears twice", ErrLayout, p.Name)
		case p.DType != "float32":
			return nil, fmt.Errorf("%w: parameter %q has dtype %q; the bridge all-reduces float32 parameters only", ErrLayout, p.Name, p.DType)
		}
		names[p.Name] = true
		n := 1
		for _, d := range p.Shape {
			if d < 1 || d > maxValues || n > maxValues/d {
				return nil, fmt.Errorf("%w: parameter %q has shape %v (every dimension ≥ 1, at most %d values)", ErrLayout, p.Name, p.Shape, maxValues)
			}
			n *= d
		}
		numel[i] = n
	}
	l := &layout{tensors: len(params)}
	seen := make([]bool, len(params))
	desc := layoutDesc{Params: make([]descParam, len(params))}
	h := sha256.New()
	for bi, b := range buckets {
		if len(b) == 0 {
			return nil, fmt.Errorf("%w: bucket %d is empty", ErrLayout, bi)
		}
		var shapes [][]int
		size := 0
		for _, i := range b {
			if i < 0 || i >= len(params) || seen[i] {
				return nil, fmt.Errorf("%w: bucket %d lists parameter %d, which is out of range or in another bucket", ErrLayout, bi, i)
			}
			seen[i] = true
			desc.Params[i] = descParam{Name: params[i].Name, Shape: params[i].Shape, DType: params[i].DType, Bucket: bi}
			shape := params[i].Shape
			if len(shape) == 0 {
				shape = []int{1} // a scalar
			}
			shapes = append(shapes, shape)
			size += numel[i]
			if l.n+size > maxValues {
				return nil, fmt.Errorf("%w: more than %d values", ErrLayout, maxValues)
			}
			h.Write([]byte(params[i].Name))
			h.Write([]byte{0})
			for _, d := range shape {
				h.Write(binary.LittleEndian.AppendUint64(nil, uint64(d)))
			}
		}
		h.Write([]byte{1}) // bucket boundary
		l.buckets = append(l.buckets, compress.Layout{Shapes: shapes})
		l.offsets = append(l.offsets, l.n)
		l.sizes = append(l.sizes, size)
		l.n += size
	}
	for i, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("%w: parameter %q is in no bucket", ErrLayout, params[i].Name)
		}
	}
	h.Sum(l.digest[:0])
	b, err := json.Marshal(desc)
	if err != nil {
		return nil, fmt.Errorf("bridge: describe the layout: %w", err)
	}
	l.desc = b
	return l, nil
}

// layoutDesc is a layout as another peer reads it (the layout protocol):
// the parameters in the process's order, each with its bucket.
type layoutDesc struct {
	Params []descParam `json:"params"`
}

type descParam struct {
	Name   string `json:"name"`
	Shape  []int  `json:"shape"`
	DType  string `json:"dtype"`
	Bucket int    `json:"bucket"`
}

// check refuses a description that no process could have registered
// (parseLayout's bounds): it comes from another peer.
func (d layoutDesc) check() error {
	if len(d.Params) == 0 || len(d.Params) > maxParams {
		return fmt.Errorf("%d parameters (1 to %d)", len(d.Params), maxParams)
	}
	names := make(map[string]bool, len(d.Params))
	for i, p := range d.Params {
		switch {
		case p.Name == "" || len(p.Name) > maxNameLen || names[p.Name]:
			return fmt.Errorf("parameter %d has no name, a name longer than %d bytes, or another's", i, maxNameLen)
		case len(p.DType) > 16 || len(p.Shape) > 32:
			return fmt.Errorf("parameter %d has a dtype or a shape no tensor has", i)
		case p.Bucket < 0 || p.Bucket >= len(d.Params):
			return fmt.Errorf("parameter %d is in bucket %d of %d parameters", i, p.Bucket, len(d.Params))
		}
		for _, n := range p.Shape {
			if n < 1 || n > maxValues {
				return fmt.Errorf("parameter %d has shape %v", i, p.Shape)
			}
		}
		names[p.Name] = true
	}
	return nil
}

// maxDifferences bounds the differences ExplainLayout names, and
// maxExplanation the length of the explanation.
const (
	maxDifferences = 5
	maxExplanation = 2000
)

// ExplainLayout names how a layout description from another peer (the
// layout protocol: Learner.Layout there) differs from this process's:
// parameters that only one side has, shapes that differ, another order or
// other buckets. It returns "" when they are the same, and an error when
// theirs is not a layout description.
func (l *Learner) ExplainLayout(theirs []byte) (string, error) {
	return explainLayout(l.lay.desc, theirs)
}

// Layout returns this process's layout description, which a peer whose
// layout differs fetches to name the difference (ExplainLayout).
func (l *Learner) Layout() []byte { return l.lay.desc }

func explainLayout(mineJSON, theirsJSON []byte) (string, error) {
	var mine, theirs layoutDesc
	if err := json.Unmarshal(mineJSON, &mine); err != nil {
		return "", fmt.Errorf("bridge: this process's layout description: %w", err)
	}
	if err := json.Unmarshal(theirsJSON, &theirs); err != nil {
		return "", fmt.Errorf("bridge: the peer's layout description: %w", err)
	}
	if err := theirs.check(); err != nil {
		return "", fmt.Errorf("bridge: the peer's layout description: %v", err)
	}
	shape := func(p descParam) string {
		if p.DType != "" && p.DType != "float32" {
			return fmt.Sprintf("%v %q", p.Shape, p.DType)
		}
		return fmt.Sprint(p.Shape)
	}
	index := func(ps []descParam) map[string]int {
		m := make(map[string]int, len(ps))
		for i, p := range ps {
			m[p.Name] = i
		}
		return m
	}
	mi, ti := index(mine.Params), index(theirs.Params)
	var diffs []string
	for _, p := range mine.Params {
		j, ok := ti[p.Name]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%q %s is only here", p.Name, shape(p)))
		case shape(p) != shape(theirs.Params[j]):
			diffs = append(diffs, fmt.Sprintf("%q has shape %s here, %s in the cluster's", p.Name, shape(p), shape(theirs.Params[j])))
		}
	}
	for _, p := range theirs.Params {
		if _, ok := mi[p.Name]; !ok {
			diffs = append(diffs, fmt.Sprintf("%q %s is only in the cluster's", p.Name, shape(p)))
		}
	}
	if len(diffs) == 0 {
		for i := range min(len(mine.Params), len(theirs.Params)) {
			if mine.Params[i].Name != theirs.Params[i].Name {
				diffs = append(diffs, fmt.Sprintf("the parameters are in another order: #%d is %q here, %q in the cluster's",
					i, mine.Params[i].Name, theirs.Params[i].Name))
				break
			}
		}
	}
	sameBucket := func(a, b descParam) bool { return a.Bucket == b.Bucket }
	if len(diffs) == 0 && !slices.EqualFunc(mine.Params, theirs.Params, sameBucket) {
		count := func(ps []descParam) int {
			return slices.MaxFunc(ps, func(a, b descParam) int { return a.Bucket - b.Bucket }).Bucket + 1
		}
		diffs = append(diffs, fmt.Sprintf("the parameters are grouped into other buckets (%d here, %d in the cluster's; the bucket size differs)",
			count(mine.Params), count(theirs.Params)))
	}
	if len(diffs) > maxDifferences {
		diffs = append(diffs[:maxDifferences], fmt.Sprintf("and %d more differences", len(diffs)-maxDifferences))
	}
	out := strings.Join(diffs, "; ")
	if len(out) > maxExplanation {
		out = strings.ToValidUTF8(out[:maxExplanation], "") + " …"
	}
	return out, nil
}

// settingsOf returns the cluster settings of a process: its layout's
// summary and its own settings, prefixed with "external.".
func settingsOf(l *layout, own map[string]string) (train.Settings, error) {
	if len(own) > maxSettings {
		return nil, fmt.Errorf("%w: %d settings (at most %d)", ErrLayout, len(own), maxSettings)
	}
	s := train.Settings{
		LayoutKey: fmt.Sprintf("%d tensors, %d values, %d buckets, sha256 %x", l.tensors, l.n, len(l.buckets), l.digest[:8]),
	}
	for k, v := range own {
		if !settingKey.MatchString(k) || len(v) > maxSettingLen {
			return nil, fmt.Errorf("%w: setting %q: keys are 1-128 of [A-Za-z0-9_.-], values at most %d bytes", ErrLayout, k, maxSettingLen)
		}
		s[settingsPrefix+k] = v
	}
	return s, nil
}
