package data

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckFashionMNIST: the check passes where LoadFashionMNIST finds the
// files, and names the directory, the missing files or the bad header
// otherwise.
func TestCheckFashionMNIST(t *testing.T) {
	for _, compress := range []bool{false, true} {
		dir := t.TempDir()
		writeFashion(t, dir, compress, 10, 5)
		if err := CheckFashionMNIST(dir); err != nil {
			t.Errorf("compress=%v: %v", compress, err)
		}
		t.Setenv("P2PTRAIN_DATA", dir)
		if err := CheckFashionMNIST(""); err != nil {
			t.Errorf("compress=%v, found through P2PTRAIN_DATA: %v", compress, err)
		}
	}

	missing := filepath.Join(t.TempDir(), "nope")
	partial := t.TempDir()
	writeFashion(t, partial, false, 10, 5)
	os.Remove(filepath.Join(partial, "t10k-labels-idx1-ubyte"))
	garbage := t.TempDir()
	writeFashion(t, garbage, true, 10, 5)
	os.WriteFile(filepath.Join(garbage, "train-images-idx3-ubyte.gz"), []byte("<html>not found</html>"), 0o644)
	mismatch := t.TempDir()
	writeFashion(t, mismatch, false, 10, 5)
	os.WriteFile(filepath.Join(mismatch, "t10k-labels-idx1-ubyte"), idxBytes([]int{4}, make([]byte, 4)), 0o644)
	for _, tc := range []struct {
		name, dir string
		is        error
		want      []string
	}{
		{"missing directory", missing, ErrNoDataset, []string{missing, "no such file"}},
		{"missing file", partial, ErrNoDataset, []string{"t10k-labels-idx1-ubyte(.gz) not in " + partial}},
		{"not an IDX file", garbage, ErrBadIDX, []string{filepath.Join(garbage, "train-images-idx3-ubyte.gz"), "magic"}},
		{"labels for other images", mismatch, ErrBadIDX, []string{filepath.Join(mismatch, "t10k-labels-idx1-ubyte"), "dimensions [4], want [5]"}},
	} {
		err := CheckFashionMNIST(tc.dir)
		if !errors.Is(err, tc.is) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.is)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", tc.name, err, w)
			}
		}
	}
}

// TestCheckText: the check agrees with LoadText on small corpora, passes a
// large one, honours MaxBytes and rejects the options LoadText rejects.
func TestCheckText(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	writeText(t, filepath.Join(small, "a.go"), randText(3, 300))
	enough := filepath.Join(dir, "enough")
	writeText(t, filepath.Join(enough, "a.go"), randText(4, 200_000))
	empty := filepath.Join(dir, "empty")
	writeText(t, filepath.Join(empty, "notes.txt"), randText(5, 10_000))
	for _, p := range []string{small, empty, filepath.Join(dir, "nope"), enough} {
		_, lerr := LoadText(p, textOpts(16))
		cerr := CheckText(p, textOpts(16))
		if (lerr == nil) != (cerr == nil) || lerr != nil && lerr.Error() != cerr.Error() {
			t.Errorf("%s: CheckText %v, LoadText %v", p, cerr, lerr)
		}
	}

	// 64 MiB of matching text (sparse: it takes no disk).
	big := filepath.Join(dir, "big")
	writeText(t, filepath.Join(big, "a.go"), nil)
	if err := os.Truncate(filepath.Join(big, "a.go"), 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := CheckText(big, textOpts(16)); err != nil {
		t.Errorf("64 MiB corpus: %v", err)
	}
	o := textOpts(16)
	o.MaxBytes = 300
	if err := CheckText(big, o); !errors.Is(err, ErrNoText) || !strings.Contains(err.Error(), "300 bytes") {
		t.Errorf("64 MiB corpus cut at 300 bytes: %v, want too little text", err)
	}
	o.Context = 0
	if err := CheckText(big, o); err == nil || !strings.Contains(err.Error(), "context 0") {
		t.Errorf("context 0: %v", err)
	}
}

// TestCheckGoSource: the default corpus passes.
func TestCheckGoSource(t *testing.T) {
	if _, err := GoSourceDir(); err != nil {
		t.Skip(err)
	}
	if err := CheckGoSource(TextOptions{HeldOut: DefaultHeldOut, Context: 128}); err != nil {
		t.Fatal(err)
	}
}

// TestCheckFashionMNISTFileSize: an uncompressed IDX file whose size
// contradicts its header (truncated, or with bytes past the declared
// data) is rejected, naming the file and both sizes; LoadFashionMNIST
// would refuse it too.
func TestCheckFashionMNISTFileSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int64
		want []string
	}{
		{"truncated", 100, []string{"truncated", "has 100 bytes", "declares 7856"}},
		{"trailing bytes", 7856 + 3, []string{"has 7859 bytes", "3 more than the 7856"}},
	} {
		dir := t.TempDir()
		writeFashion(t, dir, false, 10, 5)
		p := filepath.Join(dir, "train-images-idx3-ubyte") // 16 header bytes + 10×28×28
		if err := os.Truncate(p, tc.size); err != nil {
			t.Fatal(err)
		}
		if _, _, err := LoadFashionMNIST(dir); err == nil {
			t.Fatalf("%s: LoadFashionMNIST accepts the file", tc.name)
		}
		err := CheckFashionMNIST(dir)
		wantBadIDX(t, tc.name, err, append(tc.want, p+":"))
	}
}

// TestCheckFashionMNISTGzipSize: a gzip-compressed IDX file that is cut
// short (a truncated download), or whose data is not what its header
// declares, is rejected naming the file; LoadFashionMNIST would refuse it
// too. Several gzip members (the trailer then records only the last) are
// counted whole and pass.
func TestCheckFashionMNISTGzipSize(t *testing.T) {
	header := idxBytes([]int{10, 28, 28}, nil) // 16 bytes declaring 7856
	for _, tc := range []struct {
		name string
		file func(good []byte) []byte
		want []string // "": the check passes
	}{
		{"whole", func(good []byte) []byte { return good }, nil},
		{"cut short", func(good []byte) []byte { return good[:len(good)-40] }, []string{"truncated or corrupt"}},
		{"short data", func([]byte) []byte { return gz(append(header, make([]byte, 7000)...)) }, []string{"truncated: it decompresses to 7016 bytes", "declares 7856"}},
		{"long data", func([]byte) []byte { return gz(append(header, make([]byte, 7900)...)) }, []string{"60 more than the 7856"}},
		{"two members", func([]byte) []byte {
			return append(gz(append(header, make([]byte, 7000)...)), gz(make([]byte, 840))...)
		}, nil},
	} {
		dir := t.TempDir()
		writeFashion(t, dir, true, 10, 5)
		p := filepath.Join(dir, "train-images-idx3-ubyte.gz")
		good, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, tc.file(good), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, lerr := LoadFashionMNIST(dir)
		err = CheckFashionMNIST(dir)
		if tc.want == nil {
			if err != nil || lerr != nil {
				t.Errorf("%s: check %v, load %v; want both to pass", tc.name, err, lerr)
			}
			continue
		}
		if lerr == nil {
			t.Errorf("%s: LoadFashionMNIST accepts the file", tc.name)
		}
		wantBadIDX(t, tc.name, err, append(tc.want, p+":"))
	}
}

// wantBadIDX checks that err is ErrBadIDX with every one of want in its text.
func wantBadIDX(t *testing.T, name string, err error, want []string) {
	t.Helper()
	if !errors.Is(err, ErrBadIDX) {
		t.Errorf("%s: error %v, want %v", name, err, ErrBadIDX)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: error %q lacks %q", name, err, w)
		}
	}
}

// TestCheckFashionMNISTForModel: images of a shape the model does not take
// are rejected before training (the step would fail, and be retried, on
// every batch), naming the file, the images' shape and the model's; images
// of the right shape pass for every image model.
func TestCheckFashionMNISTForModel(t *testing.T) {
	good := t.TempDir()
	writeFashion(t, good, true, 10, 5)
	for _, m := range []string{"mlp", "cnn"} {
		if err := CheckFashionMNISTFor(good, m); err != nil {
			t.Errorf("%s, 28×28 images: %v", m, err)
		}
	}
	small := t.TempDir()
	writeFashion(t, small, true, 10, 5)
	p := filepath.Join(small, "train-images-idx3-ubyte.gz")
	if err := os.WriteFile(p, gz(idxBytes([]int{10, 2, 2}, make([]byte, 40))), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckFashionMNIST(small); err != nil {
		t.Fatalf("without a model 2×2 images are valid IDX: %v", err)
	}
	for m, want := range map[string]string{
		"mlp": p + ": images are 2×2, mlp needs 28×28 (784 pixels)",
		"cnn": p + ": images are 2×2, cnn needs 28×28",
	} {
		err := CheckFashionMNISTFor(small, m)
		var se *ShapeError
		if !errors.As(err, &se) || err.Error() != want {
			t.Errorf("%s: error %v, want %q", m, err, want)
		}
	}
	if err := CheckFashionMNISTFor(good, "nope"); err == nil {
		t.Error("an unknown model passes")
	}
}
