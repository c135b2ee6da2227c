package data

import (
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/p2ptrain/p2ptrain/gpu"
	"github.com/p2ptrain/p2ptrain/model"
)

// This file checks that a dataset can be loaded without loading it, so a
// command can reject a bad configuration before it starts anything.

// CheckFashionMNIST reports whether LoadFashionMNIST(dir) would find the
// Fashion-MNIST files, reading only their IDX headers: each of the four
// files exists (plain or .gz) and starts with a valid header, images are
// n×rows×cols and labels n, with the same n, and an uncompressed file is
// as long as its header declares. dir "" searches like
// FindFashionMNIST. A missing directory or file is an ErrNoDataset error,
// a bad header or size an ErrBadIDX one; every bad header is reported.
func CheckFashionMNIST(dir string) error {
	return checkFashion(dir, nil)
}

// CheckFashionMNISTFor is CheckFashionMNIST for training model name
// (model.Names; "mlp" or "cnn"): it also reports, as a *ShapeError, image
// files whose images do not have the shape the model takes
// (model.Model.InputShape).
func CheckFashionMNISTFor(dir, name string) error {
	input, err := modelInput(name)
	if err != nil {
		return err
	}
	return checkFashion(dir, func(path string, dims []int) error {
		if fitsInput(dims[1], dims[2], input) {
			return nil
		}
		return &ShapeError{Path: path, Rows: dims[1], Cols: dims[2], Model: name, Input: input}
	})
}

// ShapeError reports an image file whose images do not fit the model.
type ShapeError struct {
	// Path is the image file.
	Path string
	// Rows and Cols are its images' shape.
	Rows, Cols int
	// Model is the model's name and Input its per-sample input shape.
	Model string
	Input []int
}

func (e *ShapeError) Error() string {
	var need string
	switch in := e.Input; len(in) {
	case 3:
		need = fmt.Sprintf("%d×%d", in[0], in[1])
		if in[2] != 1 {
			need += fmt.Sprintf("×%d", in[2])
		}
	case 1:
		need = fmt.Sprintf("%d pixels an image", in[0])
		if s := int(math.Sqrt(float64(in[0]))); s*s == in[0] {
			need = fmt.Sprintf("%d×%d (%d pixels)", s, s, in[0])
		}
	default:
		need = fmt.Sprintf("inputs of shape %v", in)
	}
	return fmt.Sprintf("%s: images are %d×%d, %s needs %s", e.Path, e.Rows, e.Cols, e.Model, need)
}

// fitsInput reports whether single-channel rows×cols images (a Dataset's
// samples) are inputs of shape input: an image of the shape for a
// convolutional model, its pixels' count for a dense one.
func fitsInput(rows, cols int, input []int) bool {
	switch len(input) {
	case 3:
		return rows == input[0] && cols == input[1] && input[2] == 1
	case 1:
		return rows*cols == input[0]
	}
	return false
}

// modelInput returns the per-sample input shape of model name, asking a
// smallest instance of it on the CPU.
func modelInput(name string) ([]int, error) {
	m, err := model.New(name, model.Config{Hidden: []int{1}, MaxBatch: 1}, []gpu.Device{gpu.NewCPU(0)}, 0)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	return m.InputShape(), nil
}

// checkFashion is CheckFashionMNIST; fit, when not nil, checks the
// dimensions (n×rows×cols) of each image file with a valid header.
func checkFashion(dir string, fit func(path string, dims []int) error) error {
	if dir == "" {
		var err error
		if dir, err = FindFashionMNIST(); err != nil {
			return err
		}
	} else if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return fmt.Errorf("%w: %s: %v", ErrNoDataset, dir, err)
	}
	paths := make([]string, len(fashionFiles))
	var missing []string
	for i, name := range fashionFiles {
		var err error
		if paths[i], err = idxPath(dir, name); err != nil {
			missing = append(missing, name+"(.gz)")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s not in %s", ErrNoDataset, strings.Join(missing, ", "), dir)
	}
	var errs []error
	for i := 0; i+1 < len(paths); i += 2 {
		img, ierr := idxFileDims(paths[i])
		lab, lerr := idxFileDims(paths[i+1])
		errs = append(errs, ierr, lerr)
		switch {
		case ierr != nil || lerr != nil:
		case len(img) != 3:
			errs = append(errs, fmt.Errorf("%s: %w: dimensions %v, want n×rows×cols", paths[i], ErrBadIDX, img))
		case len(lab) != 1 || lab[0] != img[0]:
			errs = append(errs, fmt.Errorf("%s: %w: dimensions %v, want [%d] (a label per image)", paths[i+1], ErrBadIDX, lab, img[0]))
		}
		if ierr == nil && len(img) == 3 && fit != nil {
			errs = append(errs, fit(paths[i], img))
		}
	}
	return errors.Join(errs...)
}

// idxFileDims returns the dimensions the header of IDX file p (plain or
// gzip-compressed) declares. A file must hold exactly the bytes its header
// declares (ReadIDX's verdict): an uncompressed one by its size, a
// compressed one by the size its gzip trailer records, and only when that
// disagrees (a truncated download, or several gzip members) by
// decompressing it whole.
func idxFileDims(p string) ([]int, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	s, err := idxStream(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	defer s.Close()
	dims, total, err := readIDXHeader(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	want := int64(4+4*len(dims)) + int64(total)
	if _, compressed := s.(*gzip.Reader); compressed {
		if err := checkGzipSize(f, s, p, dims, want); err != nil {
			return nil, err
		}
	} else {
		st, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		switch size := st.Size(); {
		case size < want:
			return nil, fmt.Errorf("%s: %w: truncated: the file has %d bytes, its header %v declares %d", p, ErrBadIDX, size, dims, want)
		case size > want:
			return nil, fmt.Errorf("%s: %w: the file has %d bytes, %d more than the %d its header %v declares", p, ErrBadIDX, size, size-want, want, dims)
		}
	}
	return dims, nil
}

// checkGzipSize checks that gzip-compressed IDX file p (f, whose header s
// has read) decompresses to want bytes, as its header dims declare. The
// trailer's ISIZE (the size modulo 2³²) settles it cheaply when it agrees;
// otherwise the rest is decompressed and counted, which tells a truncated
// stream, a corrupt one and a size mismatch apart. (A file of several gzip
// members whose last one alone has the declared size, such as one stream
// written twice, passes here and is refused at load.)
func checkGzipSize(f *os.File, s io.Reader, p string, dims []int, want int64) error {
	var trailer [4]byte
	if st, err := f.Stat(); err == nil && st.Size() >= 18 {
		if _, err := f.ReadAt(trailer[:], st.Size()-4); err == nil && binary.LittleEndian.Uint32(trailer[:]) == uint32(want) {
			return nil
		}
	}
	rest, err := io.Copy(io.Discard, s)
	got := int64(4+4*len(dims)) + rest
	switch {
	case err != nil && got < want:
		return fmt.Errorf("%s: %w: truncated or corrupt: it decompresses to %d bytes before %v, its header %v declares %d", p, ErrBadIDX, got, err, dims, want)
	case err != nil:
		return fmt.Errorf("%s: %w: gzip: %v", p, ErrBadIDX, err)
	case got < want:
		return fmt.Errorf("%s: %w: truncated: it decompresses to %d bytes, its header %v declares %d", p, ErrBadIDX, got, dims, want)
	case got > want:
		return fmt.Errorf("%s: %w: it decompresses to %d bytes, %d more than the %d its header %v declares", p, ErrBadIDX, got, got-want, want, dims)
	}
	return nil
}

// checkTextBlocks is how many split blocks of matching text CheckText
// accepts on the files' sizes alone: enough for a few held-out blocks and
// many training windows at any context.
const checkTextBlocks = 64

// CheckText reports whether LoadText(path, opts) would find enough text,
// without reading a large corpus: a corpus whose matching files (up to
// opts.MaxBytes) hold at least 16 MiB, or 64 blocks of the train/held-out
// split if that is more, passes on the sizes its walk lists; a smaller one
// is loaded and split, which is quick, for LoadText's own verdict. Its
// errors are LoadText's (ErrNoText for a missing path or too little text).
func CheckText(path string, opts TextOptions) error {
	if err := opts.validate(); err != nil {
		return err
	}
	enough := max(16<<20, checkTextBlocks*int64(max(textBlock, 2*(opts.Context+1))))
	if opts.MaxBytes > 0 && opts.MaxBytes < enough {
		_, err := LoadText(path, opts)
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		_, err := LoadText(path, opts) // its error names the path
		return err
	}
	size := st.Size()
	if st.IsDir() {
		o := opts
		o.MaxBytes = enough // stop the walk there
		if _, size, err = listTree(path, o); err != nil {
			return err
		}
	}
	if size < enough {
		_, err = LoadText(path, opts)
		return err
	}
	return nil
}

// CheckGoSource is CheckText for LoadGoSource's corpus.
func CheckGoSource(opts TextOptions) error {
	dir, opts, err := goSource(opts)
	if err != nil {
		return err
	}
	return CheckText(dir, opts)
}
