package data

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// This file checks that a dataset can be loaded without loading it, so a
// command can reject a bad configuration before it starts anything.

// CheckFashionMNIST reports whether LoadFashionMNIST(dir) would find the
// Fashion-MNIST files, reading only their IDX headers: each of the four
// files exists (plain or .gz) and starts with a valid header, images are
// n×rows×cols and labels n, with the same n. dir "" searches like
// FindFashionMNIST. A missing directory or file is an ErrNoDataset error,
// a bad header an ErrBadIDX one; every bad header is reported.
func CheckFashionMNIST(dir string) error {
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
	}
	return errors.Join(errs...)
}

// idxFileDims returns the dimensions the header of IDX file p (plain or
// gzip-compressed) declares.
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
	dims, _, err := readIDXHeader(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return dims, nil
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
