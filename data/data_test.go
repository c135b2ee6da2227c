package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/p2ptrain/p2ptrain/model"
)

// idxBytes encodes an unsigned-byte IDX file.
func idxBytes(dims []int, data []byte) []byte {
	b := []byte{0, 0, 0x08, byte(len(dims))}
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, uint32(d))
	}
	return append(b, data...)
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func TestReadIDX(t *testing.T) {
	good := idxBytes([]int{2, 2, 3}, []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255})
	tests := []struct {
		name    string
		in      []byte
		dims    []int
		errText string
	}{
		{name: "plain", in: good, dims: []int{2, 2, 3}},
		{name: "gzip", in: gz(good), dims: []int{2, 2, 3}},
		{name: "labels", in: idxBytes([]int{3}, []byte{1, 2, 3}), dims: []int{3}},
		{name: "empty", in: nil, errText: "reading magic"},
		{name: "short magic", in: []byte{0, 0}, errText: "reading magic"},
		{name: "bad magic", in: append([]byte{1}, good[1:]...), errText: "two zero bytes"},
		{name: "float type", in: append([]byte{0, 0, 0x0d}, good[3:]...), errText: "only unsigned bytes"},
		{name: "no dims", in: []byte{0, 0, 8, 0}, errText: "0 dimensions"},
		{name: "too many dims", in: []byte{0, 0, 8, 9}, errText: "9 dimensions"},
		{name: "truncated header", in: good[:9], errText: "reading dimension"},
		{name: "zero dim", in: idxBytes([]int{0, 5}, nil), errText: "is zero"},
		{name: "huge", in: idxBytes([]int{1 << 20, 1 << 20}, nil), errText: "exceeds"},
		{name: "truncated data", in: good[:len(good)-1], errText: "truncated"},
		{name: "truncated gzip data", in: gz(good[:len(good)-4]), errText: "truncated"},
		{name: "trailing", in: append(slices.Clone(good), 1), errText: "trailing"},
		{name: "broken gzip", in: gz(good)[:15], errText: "bad IDX"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, err := ReadIDX(bytes.NewReader(tc.in))
			if tc.errText != "" {
				if err == nil || !errors.Is(err, ErrBadIDX) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("error %v, want ErrBadIDX mentioning %q", err, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(x.Dims, tc.dims) || len(x.Data) != product(tc.dims) {
				t.Fatalf("dims %v, %d bytes", x.Dims, len(x.Data))
			}
		})
	}
}

// FuzzReadIDX checks that no input makes the decoder panic or return data
// inconsistent with its header.
func FuzzReadIDX(f *testing.F) {
	f.Add(idxBytes([]int{2, 3}, []byte{1, 2, 3, 4, 5, 6}))
	f.Add(gz(idxBytes([]int{1}, []byte{7})))
	f.Add([]byte{0, 0, 8, 3, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := ReadIDX(bytes.NewReader(b))
		if err == nil && len(x.Data) != product(x.Dims) {
			t.Fatalf("dims %v but %d bytes", x.Dims, len(x.Data))
		}
	})
}

// writeFashion writes a small synthetic Fashion-MNIST-shaped set into dir.
func writeFashion(t *testing.T, dir string, compress bool, nTrain, nTest int) {
	t.Helper()
	write := func(name string, dims []int, data []byte) {
		b := idxBytes(dims, data)
		if compress {
			b = gz(b)
			name += ".gz"
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []struct {
		prefix string
		n      int
	}{{"train", nTrain}, {"t10k", nTest}} {
		img := make([]byte, s.n*28*28)
		lab := make([]byte, s.n)
		for i := range lab {
			lab[i] = byte(i % 10)
			img[i*784] = byte(i)
		}
		write(s.prefix+"-images-idx3-ubyte", []int{s.n, 28, 28}, img)
		write(s.prefix+"-labels-idx1-ubyte", []int{s.n}, lab)
	}
}

func TestLoadFashionMNIST(t *testing.T) {
	for _, compress := range []bool{false, true} {
		dir := t.TempDir()
		writeFashion(t, dir, compress, 30, 12)
		t.Setenv("P2PTRAIN_DATA", dir)
		found, err := FindFashionMNIST()
		if err != nil || found != dir {
			t.Fatalf("FindFashionMNIST = %q, %v", found, err)
		}
		train, test, err := LoadFashionMNIST("")
		if err != nil {
			t.Fatal(err)
		}
		if train.Len() != 30 || test.Len() != 12 || train.SampleLen() != 784 {
			t.Fatalf("sizes %d, %d, %d", train.Len(), test.Len(), train.SampleLen())
		}
		b := train.Slice(3, 5)
		if b.Y[0] != 3 || b.X[0] != float32((3.0/255-pixelMean)/pixelStd) {
			t.Errorf("sample 3: label %d, first pixel %v", b.Y[0], b.X[0])
		}
		g := train.Gather(model.Batch{}, []int{7, 2})
		if g.Y[0] != 7 || g.Y[1] != 2 || g.X[784] != train.x[2*784] {
			t.Errorf("Gather: %v", g.Y)
		}
	}
}

func TestLoadFashionMNISTErrors(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		dirs := FashionMNISTDirs
		FashionMNISTDirs = []string{t.TempDir()}
		defer func() { FashionMNISTDirs = dirs }()
		t.Setenv("P2PTRAIN_DATA", "")
		_, _, err := LoadFashionMNIST("")
		if !errors.Is(err, ErrNoDataset) || !strings.Contains(err.Error(), "apt-get install dataset-fashion-mnist") {
			t.Fatalf("error %v does not say how to install the dataset", err)
		}
	})
	t.Run("count mismatch", func(t *testing.T) {
		dir := t.TempDir()
		writeFashion(t, dir, false, 10, 10)
		os.WriteFile(filepath.Join(dir, "t10k-labels-idx1-ubyte"), idxBytes([]int{9}, make([]byte, 9)), 0o644)
		if _, _, err := LoadFashionMNIST(dir); err == nil || !strings.Contains(err.Error(), "10 images but 9 labels") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("bad label", func(t *testing.T) {
		dir := t.TempDir()
		writeFashion(t, dir, false, 10, 10)
		os.WriteFile(filepath.Join(dir, "train-labels-idx1-ubyte"), idxBytes([]int{10}, []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 10}), 0o644)
		if _, _, err := LoadFashionMNIST(dir); err == nil || !strings.Contains(err.Error(), "label 10") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("truncated file", func(t *testing.T) {
		dir := t.TempDir()
		writeFashion(t, dir, false, 10, 10)
		p := filepath.Join(dir, "train-images-idx3-ubyte")
		b, _ := os.ReadFile(p)
		os.WriteFile(p, b[:len(b)-100], 0o644)
		_, _, err := LoadFashionMNIST(dir)
		if !errors.Is(err, ErrBadIDX) || !strings.Contains(err.Error(), p) {
			t.Fatalf("error %v does not name the truncated file", err)
		}
	})
}

// TestRealFashionMNIST checks the installed dataset (scripts/setup.sh
// installs it; like every test that needs it, this one fails without it).
func TestRealFashionMNIST(t *testing.T) {
	dir, err := FindFashionMNIST()
	if err != nil {
		t.Fatalf("%v (run scripts/setup.sh)", err)
	}
	train, test, err := LoadFashionMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	if train.Len() != 60000 || test.Len() != 10000 || train.SampleLen() != 784 {
		t.Fatalf("train %d, test %d, sample %d", train.Len(), test.Len(), train.SampleLen())
	}
	var counts [10]int
	for _, y := range test.Labels() {
		counts[y]++
	}
	for c, n := range counts {
		if n != 1000 {
			t.Errorf("class %d has %d test samples, want 1000", c, n)
		}
	}
}

func TestSampler(t *testing.T) {
	const n, world, batch = 1000, 4, 32
	spe := n / (world * batch) // 7 steps per epoch
	s := NewSampler(5, n)
	seenEpoch := map[int]bool{}
	for step := int64(0); step < int64(3*spe); step++ {
		if step%int64(spe) == 0 {
			seenEpoch = map[int]bool{}
		}
		inStep := map[int]bool{}
		for r := 0; r < world; r++ {
			idx, err := s.Indices(nil, step, r, world, batch)
			if err != nil {
				t.Fatal(err)
			}
			if len(idx) != batch {
				t.Fatalf("len %d", len(idx))
			}
			// The stateless form agrees with the cached one.
			again, _ := Shard(5, step, r, world, batch, n)
			if !slices.Equal(idx, again) {
				t.Fatalf("step %d rank %d: Shard differs from Sampler", step, r)
			}
			for _, i := range idx {
				if i < 0 || i >= n {
					t.Fatalf("index %d out of range", i)
				}
				if inStep[i] {
					t.Fatalf("step %d: sample %d drawn by two ranks", step, i)
				}
				if seenEpoch[i] {
					t.Fatalf("step %d: sample %d drawn twice in an epoch", step, i)
				}
				inStep[i], seenEpoch[i] = true, true
			}
		}
	}
	a, _ := Shard(5, 0, 0, world, batch, n)
	b, _ := Shard(5, int64(spe), 0, world, batch, n)
	c, _ := Shard(6, 0, 0, world, batch, n)
	if slices.Equal(a, b) || slices.Equal(a, c) {
		t.Error("epochs or seeds repeat the same shard")
	}
	// Pinned values: the shard must not change across Go versions or builds.
	if got := a[:4]; !slices.Equal(got, pinnedShard) {
		t.Errorf("Shard(5, 0, 0, 4, 32, 1000)[:4] = %v, want %v", got, pinnedShard)
	}
	for _, bad := range [][4]int{{-1, 4, 8, 0}, {4, 4, 8, 0}, {0, 0, 8, 0}, {0, 4, 0, 0}, {0, 4, 8, -1}, {0, 200, 8, 0}} {
		if _, err := Shard(1, int64(bad[3]), bad[0], bad[1], bad[2], n); err == nil {
			t.Errorf("Shard accepted rank %d world %d batch %d step %d", bad[0], bad[1], bad[2], bad[3])
		}
	}
}

var pinnedShard = []int{964, 297, 557, 851}

func product(dims []int) int {
	n := 1
	for _, d := range dims {
		n *= d
	}
	return n
}

// TestSamplerRangeUnequalParts: parts of unequal size that split one global
// batch draw exactly the samples equal parts draw, without overlap.
func TestSamplerRangeUnequalParts(t *testing.T) {
	const n, global = 1000, 64
	s := NewSampler(5, n)
	for step := int64(0); step < 40; step++ {
		var equal, unequal []int
		for r := range 4 {
			part, err := s.Indices(nil, step, r, 4, global/4)
			if err != nil {
				t.Fatal(err)
			}
			equal = append(equal, part...)
		}
		for _, p := range [][2]int{{0, 32}, {32, 16}, {48, 16}} {
			part, err := s.Range(nil, step, p[0], p[1], global)
			if err != nil {
				t.Fatal(err)
			}
			unequal = append(unequal, part...)
		}
		slices.Sort(equal)
		slices.Sort(unequal)
		if !slices.Equal(equal, unequal) || len(slices.Compact(slices.Clone(unequal))) != global {
			t.Fatalf("step %d: unequal parts drew %v, equal parts %v", step, unequal, equal)
		}
	}
	if _, err := s.Range(nil, 0, 60, 8, global); err == nil {
		t.Fatal("a range past the global batch was accepted")
	}
}
