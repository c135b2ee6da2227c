package data

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/model"
)

// randText returns n deterministic pseudo-random bytes from seed, drawn from
// all 256 values.
func randText(seed uint64, n int) []byte {
	b := make([]byte, n)
	s := seed
	for i := range b {
		s += 0x9e3779b97f4a7c15
		z := (s ^ (s >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		b[i] = byte(z ^ (z >> 31))
	}
	return b
}

func writeText(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// textTree writes a small tree and returns its root and the bytes LoadText
// with Extensions [".go"] must read, in walk order.
func textTree(t *testing.T) (string, []byte) {
	dir := t.TempDir()
	files := []struct {
		path string
		n    int
	}{
		// Written out of order: the walk must sort them.
		{"z.go", 3000},
		{"b/y.go", 5000},
		{"a.go", 7000},
		{"b/a/x.go", 2000},
		{"b/notes.txt", 4000},
		{"empty.go", 0},
		{"c.go.txt", 1000},
	}
	got := map[string][]byte{}
	for i, f := range files {
		b := randText(uint64(i), f.n)
		got[f.path] = b
		writeText(t, filepath.Join(dir, f.path), b)
	}
	var want []byte
	for _, p := range []string{"a.go", "b/a/x.go", "b/y.go", "z.go"} {
		want = append(want, got[p]...)
	}
	return dir, want
}

func textOpts(C int) TextOptions {
	return TextOptions{Extensions: []string{".go"}, HeldOut: 0.1, Context: C}
}

// TestLoadTextSplitDeterministicDisjoint: the files are read in sorted walk
// order, filtered by extension, and split into training and held-out bytes
// that partition the corpus block by block, the same on every load.
func TestLoadTextSplitDeterministicDisjoint(t *testing.T) {
	dir, want := textTree(t)
	c, err := LoadText(dir, textOpts(16))
	if err != nil {
		t.Fatal(err)
	}
	if c.Files() != 4 || c.Size() != int64(len(want)) {
		t.Fatalf("read %d files, %d bytes; want 4 files, %d bytes", c.Files(), c.Size(), len(want))
	}
	B := c.BlockSize()
	if B != SplitBlockSize(int64(len(want)), 16, 0.1) || B >= textBlock {
		t.Fatalf("block size %d", B)
	}
	// Rebuild both parts from the expected stream: they must partition it.
	var train, held []byte
	for lo := 0; lo < len(want); lo += B {
		blk := want[lo:min(lo+B, len(want))]
		if IsHeldOutBlock(int64(lo/B), 0.1) {
			held = append(held, blk...)
		} else {
			train = append(train, blk...)
		}
	}
	if !bytes.Equal(c.TrainBytes(), train) || !bytes.Equal(c.HeldOutBytes(), held) {
		t.Fatalf("split differs from the block rule: train %d held %d bytes, want %d and %d", len(c.TrainBytes()), len(c.HeldOutBytes()), len(train), len(held))
	}
	if len(held) == 0 || len(held)+len(train) != len(want) {
		t.Fatalf("held out %d of %d bytes", len(held), len(want))
	}
	if f := float64(len(held)) / float64(len(want)); math.Abs(f-0.1) > 0.05 {
		t.Errorf("held-out fraction %.3f, want about 0.1", f)
	}
	// No held-out 16-byte run occurs in the training text (random bytes
	// make accidental matches vanishingly unlikely).
	for i := 0; i+16 <= len(held); i += 16 {
		if bytes.Contains(train, held[i:i+16]) {
			t.Fatalf("held-out bytes %d..%d also in the training text", i, i+16)
		}
	}
	again, err := LoadText(dir, textOpts(16))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.TrainBytes(), c.TrainBytes()) || !bytes.Equal(again.HeldOutBytes(), c.HeldOutBytes()) {
		t.Fatal("a second load splits differently")
	}
	// The split depends on the bytes and options only: NewTextCorpus on the
	// same stream agrees, and does not modify its argument.
	orig := slices.Clone(want)
	n, err := NewTextCorpus(want, textOpts(16))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(n.TrainBytes(), c.TrainBytes()) || !bytes.Equal(n.HeldOutBytes(), c.HeldOutBytes()) {
		t.Fatal("NewTextCorpus splits the same bytes differently")
	}
	if !bytes.Equal(want, orig) {
		t.Fatal("NewTextCorpus modified its argument")
	}
}

func TestIsHeldOutBlock(t *testing.T) {
	var got []int64
	for j := range int64(60) {
		if IsHeldOutBlock(j, 0.05) {
			got = append(got, j)
		}
	}
	if !slices.Equal(got, []int64{19, 39, 59}) {
		t.Fatalf("held-out blocks at 5%%: %v, want [19 39 59]", got)
	}
	if SplitBlockSize(1<<30, 128, 0.05) != textBlock {
		t.Errorf("large corpus block %d, want %d", SplitBlockSize(1<<30, 128, 0.05), textBlock)
	}
	if b := SplitBlockSize(100, 128, 0.05); b != 512 {
		t.Errorf("tiny corpus block %d, want 512 (the least power-of-two halving holding 2 windows)", b)
	}
	if b := SplitBlockSize(100, 50000, 0.05); b != 100002 {
		t.Errorf("huge-context block %d, want 100002", b)
	}
}

// TestLoadTextFilterAndLinks: a file named directly is read whatever its
// extension; symbolic links inside the tree are not followed (a loop does
// not hang the walk), while a symlinked root is.
func TestLoadTextFilterAndLinks(t *testing.T) {
	dir := t.TempDir()
	txt := randText(7, 4000)
	writeText(t, filepath.Join(dir, "doc.txt"), txt)
	c, err := LoadText(filepath.Join(dir, "doc.txt"), textOpts(8))
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != 4000 || c.Files() != 1 {
		t.Fatalf("direct file: %d bytes in %d files", c.Size(), c.Files())
	}

	tree, want := textTree(t)
	if err := os.Symlink(tree, filepath.Join(tree, "b", "loop")); err != nil {
		t.Skip("no symlinks:", err)
	}
	if err := os.Symlink(filepath.Join(tree, "a.go"), filepath.Join(tree, "link.go")); err != nil {
		t.Fatal(err)
	}
	c, err = LoadText(tree, textOpts(8))
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != int64(len(want)) || c.Files() != 4 {
		t.Fatalf("tree with links: %d bytes in %d files, want %d in 4", c.Size(), c.Files(), len(want))
	}
	root := filepath.Join(dir, "root")
	if err := os.Symlink(tree, root); err != nil {
		t.Fatal(err)
	}
	c, err = LoadText(root, textOpts(8))
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != int64(len(want)) {
		t.Fatalf("symlinked root: %d bytes, want %d", c.Size(), len(want))
	}
	// No filter: every regular file, .txt included.
	all := textOpts(8)
	all.Extensions = nil
	c, err = LoadText(tree, all)
	if err != nil {
		t.Fatal(err)
	}
	if c.Files() != 6 {
		t.Fatalf("no filter: %d files, want 6", c.Files())
	}
}

// TestLoadTextMaxBytes: the cap cuts the walk-order stream at exactly
// MaxBytes, the same as splitting that prefix.
func TestLoadTextMaxBytes(t *testing.T) {
	dir, want := textTree(t)
	o := textOpts(8)
	o.MaxBytes = 9500 // a.go (7000) and b/a/x.go (2000) whole, then 500 bytes of b/y.go
	c, err := LoadText(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != 9500 || c.Files() != 3 {
		t.Fatalf("capped: %d bytes in %d files, want 9500 in 3", c.Size(), c.Files())
	}
	p, err := NewTextCorpus(want[:9500], textOpts(8))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.TrainBytes(), c.TrainBytes()) || !bytes.Equal(p.HeldOutBytes(), c.HeldOutBytes()) {
		t.Fatal("the capped corpus is not the split of the first MaxBytes bytes")
	}
}

func TestLoadTextErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope")
	empty := filepath.Join(dir, "empty")
	os.Mkdir(empty, 0o755)
	noGo := filepath.Join(dir, "nogo")
	writeText(t, filepath.Join(noGo, "a.txt"), randText(1, 10000))
	writeText(t, filepath.Join(noGo, "sub", "b.md"), randText(2, 10000))
	writeText(t, filepath.Join(noGo, "empty.go"), nil)
	emptyFile := filepath.Join(dir, "empty.go")
	writeText(t, emptyFile, nil)
	small := filepath.Join(dir, "small")
	writeText(t, filepath.Join(small, "a.go"), randText(3, 300))
	tests := []struct {
		name, path string
		want       []string
	}{
		{"missing", missing, []string{missing, "does not exist"}},
		{"empty dir", empty, []string{empty, "no non-empty regular files", "any extension"}},
		{"no match", noGo, []string{noGo, "no non-empty regular files", "extensions .go"}},
		{"empty file", emptyFile, []string{emptyFile, "is empty"}},
		{"too small", small, []string{small, "too small", "300 bytes", "extensions .go"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := textOpts(16)
			if tc.name == "empty dir" {
				o.Extensions = nil
			}
			_, err := LoadText(tc.path, o)
			if !errors.Is(err, ErrNoText) {
				t.Fatalf("error %v is not ErrNoText", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	t.Run("too small text", func(t *testing.T) {
		_, err := NewTextCorpus([]byte("abc"), textOpts(16))
		if !errors.Is(err, ErrNoText) || !strings.Contains(err.Error(), "too small") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("unreadable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root reads every file")
		}
		d := filepath.Join(dir, "locked")
		f := filepath.Join(d, "a.go")
		writeText(t, f, randText(4, 10000))
		os.Chmod(f, 0)
		_, err := LoadText(d, textOpts(16))
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Fatalf("error %v does not name the unreadable file", err)
		}
	})
}

func TestTextOptionsErrors(t *testing.T) {
	good := textOpts(16)
	tests := []struct {
		name string
		edit func(*TextOptions)
		want string
	}{
		{"held out 0", func(o *TextOptions) { o.HeldOut = 0 }, "held-out fraction 0"},
		{"held out 1", func(o *TextOptions) { o.HeldOut = 1 }, "held-out fraction 1"},
		{"held out NaN", func(o *TextOptions) { o.HeldOut = math.NaN() }, "held-out fraction NaN"},
		{"held out negative", func(o *TextOptions) { o.HeldOut = -0.1 }, "held-out fraction -0.1"},
		{"context 0", func(o *TextOptions) { o.Context = 0 }, "context 0"},
		{"context huge", func(o *TextOptions) { o.Context = MaxContext + 1 }, "context 1048577"},
		{"max bytes", func(o *TextOptions) { o.MaxBytes = -1 }, "max bytes -1"},
		{"extension without dot", func(o *TextOptions) { o.Extensions = []string{"go"} }, `extension "go"`},
		{"extension empty", func(o *TextOptions) { o.Extensions = []string{""} }, `extension ""`},
		{"extension dot", func(o *TextOptions) { o.Extensions = []string{"."} }, `extension "."`},
		{"extension path", func(o *TextOptions) { o.Extensions = []string{"./x"} }, `extension "./x"`},
	}
	dir, _ := textTree(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.edit(&o)
			for _, load := range []func() error{
				func() error { _, err := LoadText(dir, o); return err },
				func() error { _, err := NewTextCorpus(randText(1, 10000), o); return err },
			} {
				err := load()
				if err == nil || errors.Is(err, ErrNoText) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %v, want a bad-option error containing %q", err, tc.want)
				}
			}
		})
	}
}

// TestTextWindowContents: each window is C bytes of training text as
// float32 and its labels the same bytes shifted by one; offsets stay in
// [0, C], every window fits, and the passes move the windows.
func TestTextWindowContents(t *testing.T) {
	const C = 12
	c, err := NewTextCorpus(randText(9, 20000), TextOptions{HeldOut: 0.05, Context: C})
	if err != nil {
		t.Fatal(err)
	}
	text := c.TrainBytes()
	w := c.Train(42)
	if w.Len() != (len(text)-C)/(C+1) || w.SampleLen() != C {
		t.Fatalf("Len %d SampleLen %d for %d bytes", w.Len(), w.SampleLen(), len(text))
	}
	all := make([]int, w.Len())
	for i := range all {
		all[i] = i
	}
	moved := 0
	var b model.Batch
	for pass := range int64(3) {
		b = w.GatherPass(b, all, pass)
		if len(b.X) != len(all)*C || len(b.Y) != len(all)*C {
			t.Fatalf("pass %d: %d inputs, %d labels for %d windows", pass, len(b.X), len(b.Y), len(all))
		}
		for r, i := range all {
			off := w.Offset(pass, i)
			s := w.Start(pass, i)
			if off < 0 || off > C || s != i*(C+1)+off || s+C+1 > len(text) {
				t.Fatalf("pass %d slot %d: offset %d start %d of %d bytes", pass, i, off, s, len(text))
			}
			if pass > 0 && off != w.Offset(0, i) {
				moved++
			}
			for k := range C {
				x := b.X[r*C+k]
				if x != float32(text[s+k]) || x < 0 || x > 255 || x != float32(int(x)) {
					t.Fatalf("pass %d slot %d: X[%d] = %v, want byte %d", pass, i, k, x, text[s+k])
				}
				if b.Y[r*C+k] != text[s+k+1] {
					t.Fatalf("pass %d slot %d: Y[%d] = %d, want the next byte %d", pass, i, k, b.Y[r*C+k], text[s+k+1])
				}
			}
		}
	}
	if moved < len(all) { // two passes, each moving most slots
		t.Errorf("only %d of %d slot windows moved between passes", moved, 2*len(all))
	}
	if g := w.Gather(model.Batch{}, all[:5]); !slices.Equal(g.Y, w.GatherPass(model.Batch{}, all[:5], 0).Y) {
		t.Error("Gather is not GatherPass in pass 0")
	}
	if o := c.Train(43); o.Offset(0, 0) == w.Offset(0, 0) && o.Offset(0, 1) == w.Offset(0, 1) && o.Offset(0, 2) == w.Offset(0, 2) {
		t.Error("another seed draws the same offsets")
	}
}

// TestTextGatherReuse: Gather reuses dst's memory when it is large enough,
// grows it when it is not, and trims it to the batch.
func TestTextGatherReuse(t *testing.T) {
	c, err := NewTextCorpus(randText(5, 20000), TextOptions{HeldOut: 0.05, Context: 8})
	if err != nil {
		t.Fatal(err)
	}
	w := c.Train(1)
	big := w.Gather(model.Batch{}, []int{1, 2, 3, 4})
	x0, y0 := &big.X[0], &big.Y[0]
	small := w.Gather(big, []int{7, 9})
	if &small.X[0] != x0 || &small.Y[0] != y0 {
		t.Fatal("Gather allocated although dst had room")
	}
	if len(small.X) != 16 || len(small.Y) != 16 {
		t.Fatalf("lengths %d, %d, want 16", len(small.X), len(small.Y))
	}
	fresh := w.Gather(model.Batch{}, []int{7, 9})
	if !slices.Equal(small.X, fresh.X) || !slices.Equal(small.Y, fresh.Y) {
		t.Fatal("a reused batch differs from a fresh one")
	}
	grown := w.Gather(small, []int{1, 2, 3, 4, 5, 6})
	if len(grown.X) != 48 || len(grown.Y) != 48 {
		t.Fatalf("grown lengths %d, %d", len(grown.X), len(grown.Y))
	}
	if want := w.Gather(model.Batch{}, []int{1, 2, 3, 4, 5, 6}); !slices.Equal(grown.X, want.X) || !slices.Equal(grown.Y, want.Y) {
		t.Fatal("a grown batch differs from a fresh one")
	}
}

// TestTextRanksSameGlobalBatch: one peer drawing a global batch and two
// peers splitting it unequally with Sampler.Range and GatherStep gather the
// same rows, step after step, across passes.
func TestTextRanksSameGlobalBatch(t *testing.T) {
	const C, G = 10, 12
	c, err := NewTextCorpus(randText(11, 8000), TextOptions{HeldOut: 0.1, Context: C})
	if err != nil {
		t.Fatal(err)
	}
	w := c.Train(99)
	one := NewSampler(99, w.Len())
	two := []*Sampler{NewSampler(99, w.Len()), NewSampler(99, w.Len())}
	parts := [][2]int{{0, 5}, {5, 7}}
	spe := int64(w.Len() / G)
	var idx []int
	var b1 model.Batch
	sawPass := map[int64]bool{}
	for step := range 3*spe + 2 {
		if idx, err = one.Range(idx, step, 0, G, G); err != nil {
			t.Fatal(err)
		}
		b1 = w.GatherStep(b1, idx, step, G)
		var x []float32
		var y []uint8
		for r, p := range parts {
			ri, err := two[r].Range(nil, step, p[0], p[1], G)
			if err != nil {
				t.Fatal(err)
			}
			b := w.GatherStep(model.Batch{}, ri, step, G)
			x, y = append(x, b.X...), append(y, b.Y...)
		}
		if !slices.Equal(x, b1.X) || !slices.Equal(y, b1.Y) {
			t.Fatalf("step %d: the two peers' batches differ from the one peer's", step)
		}
		if w.Pass(step, G) != step/spe {
			t.Fatalf("step %d: pass %d, want the sampler's epoch %d", step, w.Pass(step, G), step/spe)
		}
		if want := w.GatherPass(model.Batch{}, idx, step/spe); !slices.Equal(b1.X, want.X) || !slices.Equal(b1.Y, want.Y) {
			t.Fatalf("step %d: GatherStep does not gather in the sampler's epoch %d", step, step/spe)
		}
		sawPass[w.Pass(step, G)] = true
	}
	if len(sawPass) != 4 {
		t.Fatalf("passes seen: %v", sawPass)
	}
}

// TestHeldOutSamples: the held-out windows tile the held-out text without
// overlap, are capped evenly, and Slice shares their memory.
func TestHeldOutSamples(t *testing.T) {
	const C = 16
	c, err := NewTextCorpus(randText(13, 50000), TextOptions{HeldOut: 0.2, Context: C})
	if err != nil {
		t.Fatal(err)
	}
	held := c.HeldOutBytes()
	m := (len(held) - 1) / C
	all := c.HeldOutSamples(0)
	var _ model.Samples = all
	if all.Len() != m || all.SampleLen() != C {
		t.Fatalf("Len %d SampleLen %d, want %d and %d", all.Len(), all.SampleLen(), m, C)
	}
	b := all.Slice(0, m)
	for j := range m {
		for k := range C {
			if b.X[j*C+k] != float32(held[j*C+k]) || b.Y[j*C+k] != held[j*C+k+1] {
				t.Fatalf("window %d position %d: X %v Y %d, held-out bytes %d %d", j, k, b.X[j*C+k], b.Y[j*C+k], held[j*C+k], held[j*C+k+1])
			}
		}
	}
	capped := c.HeldOutSamples(10)
	if capped.Len() != 10 {
		t.Fatalf("capped Len %d, want 10", capped.Len())
	}
	for k := range 10 {
		j := k * m / 10
		if !slices.Equal(capped.Slice(k, k+1).X, all.Slice(j, j+1).X) || !slices.Equal(capped.Slice(k, k+1).Y, all.Slice(j, j+1).Y) {
			t.Fatalf("capped window %d is not held-out window %d", k, j)
		}
	}
	if again := c.HeldOutSamples(10); !slices.Equal(again.Slice(0, 10).Y, capped.Slice(0, 10).Y) {
		t.Fatal("HeldOutSamples is not deterministic")
	}
	if s := all.Slice(2, 4); &s.X[0] != &all.x[2*C] || len(s.Y) != 2*C {
		t.Fatal("Slice does not share memory or has the wrong length")
	}
	if c.HeldOutSamples(m+5).Len() != m {
		t.Fatal("a cap above the count changes the set")
	}
}

func TestUnigramEntropy(t *testing.T) {
	all := make([]byte, 256*4)
	for i := range all {
		all[i] = byte(i)
	}
	tests := []struct {
		name string
		in   []byte
		want float64
	}{
		{"empty", nil, 0},
		{"one byte repeated", bytes.Repeat([]byte{'x'}, 1000), 0},
		{"abab", bytes.Repeat([]byte("ab"), 500), 1},
		{"four equiprobable", bytes.Repeat([]byte("abcd"), 7), 2},
		{"256 equiprobable", all, 8},
		{"3:1", bytes.Repeat([]byte("aaab"), 10), 2 - 0.75*math.Log2(3)},
	}
	for _, tc := range tests {
		if got := UnigramEntropy(tc.in); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: %v bits, want %v", tc.name, got, tc.want)
		}
	}
	c, err := NewTextCorpus(bytes.Repeat([]byte("ab"), 5000), TextOptions{HeldOut: 0.05, Context: 8})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.UnigramEntropy(); math.Abs(got-1) > 1e-12 {
		t.Errorf("corpus of abab…: %v bits, want 1", got)
	}
}

func TestBitsPerByte(t *testing.T) {
	if got := BitsPerByte(math.Ln2); math.Abs(got-1) > 1e-15 {
		t.Errorf("ln 2 nats: %v bits", got)
	}
	if got := BitsPerByte(math.Log(256)); math.Abs(got-8) > 1e-12 {
		t.Errorf("ln 256 nats: %v bits", got)
	}
}

// TestLoadGoSourceSubtree loads GOROOT/src/errors, a small part of the
// default corpus.
func TestLoadGoSourceSubtree(t *testing.T) {
	src, err := GoSourceDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(src, "errors")
	var want int64
	nfiles := 0
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if info, err := e.Info(); err == nil && e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".go") && info.Size() > 0 {
			want += info.Size()
			nfiles++
		}
	}
	c, err := LoadText(dir, TextOptions{Extensions: []string{".go"}, HeldOut: DefaultHeldOut, Context: 128})
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != want || c.Files() != nfiles {
		t.Fatalf("%s: %d bytes in %d files, want %d in %d", dir, c.Size(), c.Files(), want, nfiles)
	}
	if c.Train(1).Len() < MinTrainWindows || c.HeldOutSamples(0).Len() < 1 {
		t.Fatalf("%d training windows, %d held-out", c.Train(1).Len(), c.HeldOutSamples(0).Len())
	}
	if h := c.UnigramEntropy(); h < 3 || h > 6 {
		t.Errorf("Go source unigram entropy %.2f bits per byte, want 3 to 6", h)
	}
}

// BenchmarkLoadGoSource loads the whole default corpus (GOROOT/src, .go) at
// C = 128 and reports its size. Run it alone with
// go test -run '^$' -bench LoadGoSource -benchtime 1x ./data
func BenchmarkLoadGoSource(b *testing.B) {
	var c *TextCorpus
	for b.Loop() {
		var err error
		if c, err = LoadGoSource(TextOptions{HeldOut: DefaultHeldOut, Context: 128}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(c.Size()), "bytes")
	b.ReportMetric(float64(c.Files()), "files")
	b.ReportMetric(float64(len(c.TrainBytes())), "train-bytes")
	b.ReportMetric(float64(len(c.HeldOutBytes())), "heldout-bytes")
	b.ReportMetric(float64(c.Train(1).Len()), "windows")
	b.ReportMetric(float64(c.HeldOutSamples(0).Len()), "heldout-windows")
	b.ReportMetric(c.UnigramEntropy(), "bits/byte")
}
