package data

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/p2ptrain/p2ptrain/model"
)

// This file is the byte-level text corpus for language models: a sample is a
// window of Context bytes, its labels the window shifted by one byte. The
// rules (walk order, filter, split, windows, held-out set) are in docs/data.md.

// ErrNoText reports that a text corpus path does not exist or holds too little
// text to train on.
var ErrNoText = errors.New("data: no text")

// DefaultHeldOut is a sensible TextOptions.HeldOut: 5% of the text is held out.
const DefaultHeldOut = 0.05

// MaxContext is the largest TextOptions.Context accepted.
const MaxContext = 1 << 20

// MinTrainWindows is the fewest training windows (TextWindows.Len) a corpus
// must yield; a smaller corpus is an ErrNoText error.
const MinTrainWindows = 4

// textBlock is the largest unit of the train/held-out split, in bytes.
const textBlock = 64 << 10

// TextOptions says which text LoadText reads and how it is cut up.
type TextOptions struct {
	// Extensions, when not empty, restricts a directory walk to regular
	// files whose names end in one of them (case-sensitive, each starting
	// with a dot: ".go", ".pb.go"). A file path given to LoadText directly
	// is read whatever its name.
	Extensions []string
	// HeldOut is the fraction of the text held out for evaluation, strictly
	// between 0 and 1 (DefaultHeldOut is 0.05).
	HeldOut float64
	// MaxBytes caps the bytes read (0: no cap): files are read in walk order
	// and the one that crosses the cap is cut at it.
	MaxBytes int64
	// Context is the window length C in bytes, 1 to MaxContext.
	Context int
}

func (o TextOptions) validate() error {
	if !(o.HeldOut > 0 && o.HeldOut < 1) {
		return fmt.Errorf("data: text: held-out fraction %v must be strictly between 0 and 1", o.HeldOut)
	}
	if o.MaxBytes < 0 {
		return fmt.Errorf("data: text: max bytes %d must not be negative (0 means no cap)", o.MaxBytes)
	}
	if o.Context < 1 || o.Context > MaxContext {
		return fmt.Errorf("data: text: context %d must be between 1 and %d bytes", o.Context, MaxContext)
	}
	for _, e := range o.Extensions {
		if len(e) < 2 || e[0] != '.' || strings.ContainsAny(e, `/\`) {
			return fmt.Errorf("data: text: extension %q must be a dot and a suffix, like \".go\"", e)
		}
	}
	return nil
}

// extensionsText describes an extension filter for error messages.
func extensionsText(ext []string) string {
	if len(ext) == 0 {
		return "any extension (no filter)"
	}
	return "extensions " + strings.Join(ext, ", ")
}

// TextCorpus is a byte-level text corpus in memory, split into a training
// part and a held-out part that share no byte.
type TextCorpus struct {
	path    string
	opts    TextOptions
	files   int
	total   int64
	block   int
	train   []byte
	heldOut []byte
}

// LoadText reads the text at path, a file or a directory walked recursively,
// and splits it with opts. In a directory, entries are visited in lexical
// order (filepath.WalkDir), symbolic links are not followed (so there are no
// loops; a symbolic link given as path itself is resolved), and only regular
// files matching opts.Extensions are read, concatenated with nothing between
// them. A file or directory that cannot be read fails the load with an error
// naming it rather than being skipped, so a corpus is the same wherever it
// loads. A missing path, or one with too little matching text for
// MinTrainWindows training windows and one held-out window, is an ErrNoText
// error.
func LoadText(path string, opts TextOptions) (*TextCorpus, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.Extensions = slices.Clone(opts.Extensions)
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist", ErrNoText, path)
	}
	if err != nil {
		return nil, fmt.Errorf("data: text: %w", err)
	}
	var buf []byte
	files := 0
	if !st.IsDir() {
		if buf, err = appendFile(nil, path, st.Size(), opts.MaxBytes); err != nil {
			return nil, err
		}
		if len(buf) > 0 {
			files = 1
		}
	} else {
		if buf, files, err = readTree(path, opts); err != nil {
			return nil, err
		}
	}
	if len(buf) == 0 {
		what := "is empty"
		if st.IsDir() {
			what = "holds no non-empty regular files with " + extensionsText(opts.Extensions)
		}
		return nil, fmt.Errorf("%w: %s %s", ErrNoText, path, what)
	}
	c, err := newTextCorpus(buf, opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %d bytes in %d files with %s: %v", ErrNoText, path, len(buf), files, extensionsText(opts.Extensions), err)
	}
	c.path, c.files = path, files
	return c, nil
}

// textFile is a file of a corpus directory and its size.
type textFile struct {
	path string
	size int64
}

// listTree lists the non-empty matching files under root in walk order,
// until their sizes add up to opts.MaxBytes (when it is positive), and
// returns their total size.
func listTree(root string, opts TextOptions) ([]textFile, int64, error) {
	// Walk a symlinked root: WalkDir does not follow a link, even at the root.
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, 0, fmt.Errorf("data: text: %w", err)
	}
	var list []textFile
	var sum int64
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("data: text: walking %s: %w", root, err)
		}
		if !d.Type().IsRegular() || !matchExt(d.Name(), opts.Extensions) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("data: text: walking %s: %w", root, err)
		}
		if info.Size() == 0 {
			return nil
		}
		list = append(list, textFile{p, info.Size()})
		sum += info.Size()
		if opts.MaxBytes > 0 && sum >= opts.MaxBytes {
			return filepath.SkipAll
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return list, sum, nil
}

// readTree reads the matching files under root in walk order.
func readTree(root string, opts TextOptions) ([]byte, int, error) {
	list, sum, err := listTree(root, opts)
	if err != nil {
		return nil, 0, err
	}
	if opts.MaxBytes > 0 {
		sum = min(sum, opts.MaxBytes)
	}
	buf := make([]byte, 0, sum)
	files := 0
	for _, f := range list {
		limit := int64(0)
		if opts.MaxBytes > 0 {
			limit = opts.MaxBytes - int64(len(buf))
			if limit == 0 {
				break
			}
		}
		n := len(buf)
		if buf, err = appendFile(buf, f.path, f.size, limit); err != nil {
			return nil, 0, err
		}
		if len(buf) > n {
			files++
		}
	}
	return buf, files, nil
}

func matchExt(name string, ext []string) bool {
	if len(ext) == 0 {
		return true
	}
	for _, e := range ext {
		if strings.HasSuffix(name, e) {
			return true
		}
	}
	return false
}

// appendFile appends the file at path to buf, at most limit bytes of it when
// limit > 0; size is a hint.
func appendFile(buf []byte, path string, size, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: text: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if limit > 0 {
		r = io.LimitReader(f, limit)
		size = min(size, limit)
	}
	if size > 0 && size < math.MaxInt32 {
		buf = slices.Grow(buf, int(size))
	}
	var probe [4096]byte
	for {
		var n int
		var err error
		if len(buf) < cap(buf) {
			n, err = r.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
		} else {
			// Full: look for EOF without growing buf, which the caller sized.
			n, err = r.Read(probe[:])
			buf = append(buf, probe[:n]...)
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, fmt.Errorf("data: text: reading %s: %w", path, err)
		}
	}
}

// NewTextCorpus splits a copy of text as LoadText splits what it reads;
// opts.Extensions is ignored and opts.MaxBytes cuts text. Too little text is
// an ErrNoText error.
func NewTextCorpus(text []byte, opts TextOptions) (*TextCorpus, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.Extensions = nil
	if opts.MaxBytes > 0 && int64(len(text)) > opts.MaxBytes {
		text = text[:opts.MaxBytes]
	}
	c, err := newTextCorpus(slices.Clone(text), opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %d bytes of text: %v", ErrNoText, len(text), err)
	}
	c.path, c.files = "", 1
	return c, nil
}

// SplitBlockSize returns the block size of the train/held-out split of total
// bytes with window length context and held-out fraction heldOut: 64 KiB (or
// 2·(context+1) if that is larger), halved while the text is shorter than
// ⌈2/heldOut⌉ blocks and half a block still holds two windows of
// context+1 bytes, so small corpora are split into enough blocks to hold
// some out.
func SplitBlockSize(total int64, context int, heldOut float64) int {
	minB := 2 * (context + 1)
	b := max(textBlock, minB)
	want := int64(math.Ceil(2 / heldOut))
	for b/2 >= minB && total < int64(b)*want {
		b /= 2
	}
	return b
}

// heldOutPPM is the held-out fraction in parts per million, 1 to 999999, so
// that the split is integer arithmetic.
func heldOutPPM(h float64) int64 {
	return min(max(int64(math.Round(h*1e6)), 1), 1e6-1)
}

// IsHeldOutBlock reports whether block j (bytes [j·B, (j+1)·B) of the corpus)
// is held out at held-out fraction h: block j is held out when
// ⌊(j+1)·p/10⁶⌋ > ⌊j·p/10⁶⌋ with p = round(h·10⁶), so held-out blocks are
// spread evenly, one every 1/h blocks, the first being block ⌈1/h⌉−1.
func IsHeldOutBlock(j int64, h float64) bool {
	p := heldOutPPM(h)
	return (j+1)*p/1e6 > j*p/1e6
}

// newTextCorpus splits buf in place: the training bytes are compacted to the
// front of buf, the held-out bytes copied out.
func newTextCorpus(buf []byte, opts TextOptions) (*TextCorpus, error) {
	total := int64(len(buf))
	B := SplitBlockSize(total, opts.Context, opts.HeldOut)
	held := 0
	for j := int64(0); j*int64(B) < total; j++ {
		if IsHeldOutBlock(j, opts.HeldOut) {
			held += int(min(int64(B), total-j*int64(B)))
		}
	}
	heldOut := make([]byte, 0, held)
	train := buf[:0]
	for j := int64(0); j*int64(B) < total; j++ {
		blk := buf[j*int64(B) : min((j+1)*int64(B), total)]
		if IsHeldOutBlock(j, opts.HeldOut) {
			heldOut = append(heldOut, blk...)
		} else {
			// train never overtakes the block being read: copy handles the overlap.
			train = append(train, blk...)
		}
	}
	c := &TextCorpus{opts: opts, total: total, block: B, train: slices.Clip(train), heldOut: heldOut}
	C := opts.Context
	if n := trainSlots(len(c.train), C); n < MinTrainWindows {
		return nil, fmt.Errorf("too small: %d training bytes give %d windows of %d bytes, want at least %d (with %v held out in blocks of %d bytes)",
			len(c.train), max(n, 0), C, MinTrainWindows, opts.HeldOut, B)
	}
	if len(c.heldOut) < C+1 {
		return nil, fmt.Errorf("too small: %d held-out bytes hold no window of %d+1 bytes (%v held out in blocks of %d bytes)",
			len(c.heldOut), C, opts.HeldOut, B)
	}
	return c, nil
}

// trainSlots is the number of training slots of context+1 bytes whose window,
// shifted by up to context bytes, still has its labels inside n bytes.
func trainSlots(n, context int) int {
	if n < context {
		return 0
	}
	return (n - context) / (context + 1)
}

// Path returns the path the corpus was loaded from ("" for NewTextCorpus).
func (c *TextCorpus) Path() string { return c.path }

// Options returns the options the corpus was split with.
func (c *TextCorpus) Options() TextOptions {
	o := c.opts
	o.Extensions = slices.Clone(o.Extensions)
	return o
}

// Files returns the number of non-empty files read.
func (c *TextCorpus) Files() int { return c.files }

// Size returns the number of bytes read (training plus held out).
func (c *TextCorpus) Size() int64 { return c.total }

// Context returns the window length C.
func (c *TextCorpus) Context() int { return c.opts.Context }

// BlockSize returns the block size of the train/held-out split.
func (c *TextCorpus) BlockSize() int { return c.block }

// TrainBytes returns the training text (not a copy: do not modify it).
func (c *TextCorpus) TrainBytes() []byte { return c.train }

// HeldOutBytes returns the held-out text (not a copy: do not modify it).
func (c *TextCorpus) HeldOutBytes() []byte { return c.heldOut }

// UnigramEntropy returns the entropy, in bits per byte, of the training
// bytes' frequencies: the loss, converted with BitsPerByte, of a model that
// ignores context.
func (c *TextCorpus) UnigramEntropy() float64 { return UnigramEntropy(c.train) }

// UnigramEntropy returns the entropy, in bits per byte, of the frequencies of
// the bytes of b (0 for empty b).
func UnigramEntropy(b []byte) float64 {
	if len(b) == 0 {
		return 0
	}
	var count [256]int64
	for _, x := range b {
		count[x]++
	}
	n := float64(len(b))
	h := 0.0
	for _, k := range count {
		if k > 0 {
			p := float64(k) / n
			h -= p * math.Log2(p)
		}
	}
	return max(h, 0)
}

// BitsPerByte converts a mean cross-entropy in nats per token to bits per
// byte, for byte-level tokens: nats / ln 2.
func BitsPerByte(natsPerToken float64) float64 { return natsPerToken / math.Ln2 }

// Train returns the training windows drawn with seed.
func (c *TextCorpus) Train(seed uint64) *TextWindows {
	return &TextWindows{text: c.train, context: c.opts.Context, seed: seed, n: trainSlots(len(c.train), c.opts.Context)}
}

// TextWindows are the training windows of a TextCorpus, for use with a
// Sampler over Len() samples. The training text is cut into Len() slots of
// C+1 bytes; in pass p, slot i's window starts at i·(C+1) + off(p, i), where
// off(p, i) in [0, C] is drawn from (seed, p, i) by splitmix64-style mixing, so a
// window is a function of (seed, p, i) alone and successive passes see the
// text at different byte offsets. A window of slot i may overlap the next
// slot's window by up to C bytes. TextWindows is immutable and safe for
// concurrent use.
type TextWindows struct {
	text    []byte
	context int
	seed    uint64
	n       int
}

// Len returns the number of windows (slots) n.
func (w *TextWindows) Len() int { return w.n }

// SampleLen returns the number of values per sample, the context C.
func (w *TextWindows) SampleLen() int { return w.context }

// Offset returns the shift in [0, C] of slot i's window in pass p.
func (w *TextWindows) Offset(pass int64, i int) int {
	z := model.MixSeed(model.MixSeed(w.seed, uint64(pass)), uint64(i))
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	hi, _ := bits.Mul64(z, uint64(w.context+1))
	return int(hi)
}

// Start returns the first byte of slot i's window in pass p.
func (w *TextWindows) Start(pass int64, i int) int { return i*(w.context+1) + w.Offset(pass, i) }

// Pass returns the pass (the Sampler's epoch) that step belongs to when each
// step draws global windows: step / (Len() / global), 0 if global is not in
// [1, Len()] or step is negative (the Sampler refuses those).
func (w *TextWindows) Pass(step int64, global int) int64 {
	if global <= 0 || global > w.n || step < 0 {
		return 0
	}
	return step / int64(w.n/global)
}

// Gather is GatherPass in pass 0: every slot always has the same window. It
// makes TextWindows a drop-in for Dataset.Gather; GatherStep also moves the
// windows from pass to pass.
func (w *TextWindows) Gather(dst model.Batch, idx []int) model.Batch {
	return w.GatherPass(dst, idx, 0)
}

// GatherStep fills dst with the windows of slots idx, drawn by
// Sampler.Range(…, step, …, global), in that step's pass (see Pass). The
// result is a function of (seed, step, global, idx), so ranks that split one
// global batch between them gather exactly the rows of the single-rank batch.
func (w *TextWindows) GatherStep(dst model.Batch, idx []int, step int64, global int) model.Batch {
	return w.GatherPass(dst, idx, w.Pass(step, global))
}

// GatherPass fills dst, reusing its memory, with the windows of slots idx in
// pass p and returns it: X holds len(idx)·C byte values as float32 (0 to
// 255), sample after sample, and Y the len(idx)·C next bytes, the labels of
// X's positions. Like Dataset.Gather, an index outside [0, Len()) panics.
func (w *TextWindows) GatherPass(dst model.Batch, idx []int, pass int64) model.Batch {
	C := w.context
	m := len(idx) * C
	if cap(dst.X) < m {
		dst.X = make([]float32, m)
	}
	if cap(dst.Y) < m {
		dst.Y = make([]uint8, m)
	}
	dst.X, dst.Y = dst.X[:m], dst.Y[:m]
	for r, i := range idx {
		s := w.Start(pass, i)
		win := w.text[s : s+C+1]
		x := dst.X[r*C : (r+1)*C]
		for k, b := range win[:C] {
			x[k] = float32(b)
		}
		copy(dst.Y[r*C:(r+1)*C], win[1:])
	}
	return dst
}

// HeldOutSamples returns the held-out evaluation windows, at most limit of
// them (limit <= 0: all). The held-out text of h bytes holds m = (h−1)/C windows,
// window j being X = bytes [j·C, j·C+C) and Y = bytes [j·C+1, j·C+C+1), so
// neither inputs nor labels overlap and every held-out byte after the first
// is a label once. If m > limit, windows ⌊k·m/limit⌋ for k in [0, limit)
// are kept, spread evenly over the held-out text.
func (c *TextCorpus) HeldOutSamples(limit int) *TextSamples {
	C := c.opts.Context
	m := (len(c.heldOut) - 1) / C
	keep := m
	if limit > 0 && m > limit {
		keep = limit
	}
	s := &TextSamples{context: C, x: make([]float32, keep*C), y: make([]uint8, keep*C)}
	for k := range keep {
		j := k
		if keep < m {
			j = int(int64(k) * int64(m) / int64(keep))
		}
		win := c.heldOut[j*C : j*C+C+1]
		for t, b := range win[:C] {
			s.x[k*C+t] = float32(b)
		}
		copy(s.y[k*C:(k+1)*C], win[1:])
	}
	return s
}

// TextSamples is a fixed set of text windows, implementing model.Samples: a
// sample is C byte values as float32, its labels the C next bytes.
type TextSamples struct {
	context int
	x       []float32
	y       []uint8
}

var _ model.Samples = (*TextSamples)(nil)

// Len returns the number of windows.
func (s *TextSamples) Len() int { return len(s.y) / max(s.context, 1) }

// SampleLen returns the number of values per sample, the context C.
func (s *TextSamples) SampleLen() int { return s.context }

// Slice returns windows [lo, hi) sharing the set's memory: X has (hi−lo)·C
// values and Y (hi−lo)·C labels.
func (s *TextSamples) Slice(lo, hi int) model.Batch {
	C := s.context
	return model.Batch{X: s.x[lo*C : hi*C], Y: s.y[lo*C : hi*C]}
}

// GoSourceDir returns the Go standard library's source directory,
// $GOROOT/src, with GOROOT from runtime.GOROOT() or else `go env GOROOT`.
func GoSourceDir() (string, error) {
	root := runtime.GOROOT()
	how := "runtime.GOROOT()"
	if root == "" {
		out, err := exec.Command("go", "env", "GOROOT").Output()
		if err != nil {
			return "", fmt.Errorf("%w: no GOROOT: runtime.GOROOT() is empty and `go env GOROOT` failed: %v", ErrNoText, err)
		}
		root, how = strings.TrimSpace(string(out)), "`go env GOROOT`"
		if root == "" {
			return "", fmt.Errorf("%w: no GOROOT: runtime.GOROOT() and `go env GOROOT` are empty", ErrNoText)
		}
	}
	dir := filepath.Join(root, "src")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%w: the Go source directory %s (GOROOT from %s) is missing; install the Go distribution's sources or pass a corpus path", ErrNoText, dir, how)
	}
	return dir, nil
}

// LoadGoSource loads the default text corpus, the Go standard library's
// source (GoSourceDir), with opts; Extensions defaults to ".go".
func LoadGoSource(opts TextOptions) (*TextCorpus, error) {
	dir, opts, err := goSource(opts)
	if err != nil {
		return nil, err
	}
	return LoadText(dir, opts)
}

// goSource returns GoSourceDir and opts with Extensions defaulting to ".go".
func goSource(opts TextOptions) (string, TextOptions, error) {
	dir, err := GoSourceDir()
	if len(opts.Extensions) == 0 {
		opts.Extensions = []string{".go"}
	}
	return dir, opts, err
}
