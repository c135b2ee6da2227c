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
