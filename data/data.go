// Package data holds p2ptrain's training data: IDX files, the Fashion-MNIST
// dataset, and the sampler that deals each step's batch out to the cluster.
package data

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"path/filepath"
	"strings"

	"github.com/p2ptrain/p2ptrain/model"
)

// ErrBadIDX reports a malformed IDX file.
var ErrBadIDX = errors.New("data: bad IDX data")

// ErrNoDataset reports that the Fashion-MNIST files could not be found.
var ErrNoDataset = errors.New("data: Fashion-MNIST not found")

// maxIDXBytes bounds the payload an IDX header may declare (1 GiB).
const maxIDXBytes = 1 << 30

// IDX is a decoded IDX file of unsigned bytes (type 0x08).
type IDX struct {
	Dims []int
	Data []byte
}

// ReadIDX decodes an unsigned-byte IDX stream: a 4-byte magic (0, 0, 0x08,
// ndims), ndims big-endian uint32 dimensions, then exactly their product of
// bytes. A gzip stream (magic 1f 8b) is decompressed first. Every size is
// checked before it is trusted; malformed input is an ErrBadIDX error.
func ReadIDX(r io.Reader) (*IDX, error) {
	s, err := idxStream(r)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return readIDX(s)
}

// idxStream returns the IDX bytes of r: r's own, or, for a gzip stream
// (magic 1f 8b), their decompression.
func idxStream(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReader(r)
	if head, err := br.Peek(2); err == nil && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: gzip: %v", ErrBadIDX, err)
		}
		return zr, nil
	}
	return io.NopCloser(br), nil
}

// readIDXHeader reads an IDX header, the magic and the dimensions, and
// returns the dimensions and their product (the data bytes that follow).
func readIDXHeader(r io.Reader) (dims []int, total uint64, err error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, 0, fmt.Errorf("%w: reading magic: %v", ErrBadIDX, err)
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, 0, fmt.Errorf("%w: magic %x does not start with two zero bytes", ErrBadIDX, magic)
	}
	if magic[2] != 0x08 {
		return nil, 0, fmt.Errorf("%w: element type 0x%02x, only unsigned bytes (0x08) are supported", ErrBadIDX, magic[2])
	}
	nd := int(magic[3])
	if nd < 1 || nd > 4 {
		return nil, 0, fmt.Errorf("%w: %d dimensions (want 1 to 4)", ErrBadIDX, nd)
	}
	dims = make([]int, nd)
	total = 1
	for i := range dims {
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, 0, fmt.Errorf("%w: reading dimension %d: %v", ErrBadIDX, i, err)
		}
		d := binary.BigEndian.Uint32(b[:])
		if d == 0 {
			return nil, 0, fmt.Errorf("%w: dimension %d is zero", ErrBadIDX, i)
		}
		total *= uint64(d)
		if total > maxIDXBytes {
			return nil, 0, fmt.Errorf("%w: declared size exceeds %d bytes", ErrBadIDX, maxIDXBytes)
		}
		dims[i] = int(d)
	}
	return dims, total, nil
}

func readIDX(r io.Reader) (*IDX, error) {
	dims, total, err := readIDXHeader(r)
	if err != nil {
		return nil, err
	}
	// Grow with the data actually present, never trusting the header alone.
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(r, int64(total)+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading data: %v", ErrBadIDX, err)
	}
	if uint64(n) < total {
		return nil, fmt.Errorf("%w: truncated: %d data bytes, header %v declares %d", ErrBadIDX, n, dims, total)
	}
	if uint64(n) > total {
		return nil, fmt.Errorf("%w: trailing bytes after the %d declared by header %v", ErrBadIDX, total, dims)
	}
	return &IDX{Dims: dims, Data: buf.Bytes()}, nil
}

// ReadIDXFile reads an IDX file, gzip-compressed or not.
func ReadIDXFile(path string) (*IDX, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	x, err := ReadIDX(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return x, nil
}

// Fashion-MNIST normalisation constants (training-set mean and deviation).
const (
	pixelMean = 0.2860
	pixelStd  = 0.3530
)

// Dataset is a labelled image set in memory, normalised to zero mean and unit
// variance, samples stored as HWC (for 1-channel images: row-major pixels).
type Dataset struct {
	x       []float32
	y       []uint8
	shape   []int
	classes int
}

// NewDataset pairs an image IDX (n × rows × cols) with a label IDX (n) whose
// labels are below classes.
func NewDataset(images, labels *IDX, classes int) (*Dataset, error) {
	if len(images.Dims) != 3 {
		return nil, fmt.Errorf("%w: images have dimensions %v, want n×rows×cols", ErrBadIDX, images.Dims)
	}
	if len(labels.Dims) != 1 {
		return nil, fmt.Errorf("%w: labels have dimensions %v, want n", ErrBadIDX, labels.Dims)
	}
	n := images.Dims[0]
	if labels.Dims[0] != n {
		return nil, fmt.Errorf("%w: %d images but %d labels", ErrBadIDX, n, labels.Dims[0])
	}
	for i, l := range labels.Data {
		if int(l) >= classes {
			return nil, fmt.Errorf("%w: label %d of sample %d is not below %d", ErrBadIDX, l, i, classes)
		}
	}
	var lut [256]float32
	for i := range lut {
		lut[i] = float32((float64(i)/255 - pixelMean) / pixelStd)
	}
	x := make([]float32, len(images.Data))
	for i, p := range images.Data {
		x[i] = lut[p]
	}
	return &Dataset{x: x, y: labels.Data, shape: []int{images.Dims[1], images.Dims[2], 1}, classes: classes}, nil
}

// Len returns the number of samples.
func (d *Dataset) Len() int { return len(d.y) }

// SampleLen returns the number of values per sample.
func (d *Dataset) SampleLen() int { return d.shape[0] * d.shape[1] * d.shape[2] }

// Labels returns the labels (not a copy).
func (d *Dataset) Labels() []uint8 { return d.y }

// Slice returns samples [lo, hi) as a model.Batch sharing the dataset's memory.
func (d *Dataset) Slice(lo, hi int) model.Batch {
	p := d.SampleLen()
	return model.Batch{X: d.x[lo*p : hi*p], Y: d.y[lo:hi]}
}

// Subset returns the first n samples as a Dataset sharing memory.
func (d *Dataset) Subset(n int) *Dataset {
	n = min(n, d.Len())
	return &Dataset{x: d.x[:n*d.SampleLen()], y: d.y[:n], shape: d.shape, classes: d.classes}
}

// Gather copies the samples at idx into dst, reusing its memory, and returns it.
func (d *Dataset) Gather(dst model.Batch, idx []int) model.Batch {
	p := d.SampleLen()
	if cap(dst.X) < len(idx)*p {
		dst.X = make([]float32, len(idx)*p)
	}
	if cap(dst.Y) < len(idx) {
		dst.Y = make([]uint8, len(idx))
	}
	dst.X, dst.Y = dst.X[:len(idx)*p], dst.Y[:len(idx)]
	for i, k := range idx {
		copy(dst.X[i*p:(i+1)*p], d.x[k*p:(k+1)*p])
		dst.Y[i] = d.y[k]
	}
	return dst
}

// FashionMNISTDirs are the directories FindFashionMNIST searches, after
// $P2PTRAIN_DATA: Debian's dataset-fashion-mnist package installs into the first.
var FashionMNISTDirs = []string{
	"/usr/share/datasets/fashion-mnist",
	"/usr/local/share/datasets/fashion-mnist",
	"/usr/share/fashion-mnist",
}

var fashionFiles = []string{"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}

// FindFashionMNIST returns the first directory holding the four Fashion-MNIST
// IDX files (plain or .gz): $P2PTRAIN_DATA if set, then FashionMNISTDirs.
func FindFashionMNIST() (string, error) {
	dirs := FashionMNISTDirs
	if env := os.Getenv("P2PTRAIN_DATA"); env != "" {
		dirs = append([]string{env}, dirs...)
	}
	for _, dir := range dirs {
		ok := true
		for _, f := range fashionFiles {
			if _, err := idxPath(dir, f); err != nil {
				ok = false
				break
			}
		}
		if ok {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w in %s; install it with `apt-get install dataset-fashion-mnist` or set P2PTRAIN_DATA", ErrNoDataset, strings.Join(dirs, ", "))
}

func idxPath(dir, name string) (string, error) {
	for _, p := range []string{filepath.Join(dir, name+".gz"), filepath.Join(dir, name)} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s(.gz) not in %s", ErrNoDataset, name, dir)
}

// LoadFashionMNIST loads the training and test sets from dir ("" searches
// with FindFashionMNIST).
func LoadFashionMNIST(dir string) (train, test *Dataset, err error) {
	if dir == "" {
		if dir, err = FindFashionMNIST(); err != nil {
			return nil, nil, err
		}
	}
	load := func(img, lab string) (*Dataset, error) {
		ip, err := idxPath(dir, img)
		if err != nil {
			return nil, err
		}
		lp, err := idxPath(dir, lab)
		if err != nil {
			return nil, err
		}
		ix, err := ReadIDXFile(ip)
		if err != nil {
			return nil, err
		}
		lx, err := ReadIDXFile(lp)
		if err != nil {
			return nil, err
		}
		ds, err := NewDataset(ix, lx, 10)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		return ds, nil
	}
	if train, err = load(fashionFiles[0], fashionFiles[1]); err != nil {
		return nil, nil, err
	}
	if test, err = load(fashionFiles[2], fashionFiles[3]); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

// Sampler draws every rank's samples for a step. Step s of a run belongs to
// epoch e = s / (n / G), where G = world·batch is the global batch; the global
// batch is positions [(s mod spe)·G, +G) of epoch e's seeded permutation of
// [0, n), and rank r takes its batch-sized slice r. So the global batch is a
// function of (seed, step, world, batch) alone, no two ranks draw the same
// sample in a step, and within an epoch no sample is drawn twice.
// The permutation does not depend on the Go version.
type Sampler struct {
	seed  uint64
	n     int
	epoch int64
	perm  []int
	// global is the global batch size the cached epoch was computed for.
	global int
}

// NewSampler returns a Sampler over n samples.
func NewSampler(seed uint64, n int) *Sampler {
	return &Sampler{seed: seed, n: n, epoch: -1}
}

// Indices returns the sample indices rank draws at step when each of world
// ranks draws batch samples, appended to dst[:0].
func (s *Sampler) Indices(dst []int, step int64, rank, world, batch int) ([]int, error) {
	if world <= 0 || rank < 0 || rank >= world || batch <= 0 {
		return nil, fmt.Errorf("data: sampler: bad rank %d / world %d / batch %d", rank, world, batch)
	}
	return s.Range(dst, step, rank*batch, batch, world*batch)
}

// Range returns positions [offset, offset+size) of step's global batch of
// global samples, appended to dst[:0]. The global batches of consecutive
// steps walk one shuffle of the data set (a new shuffle each pass), so
// ranks that split [0, global) between them draw disjoint samples however
// unequal their parts.
func (s *Sampler) Range(dst []int, step int64, offset, size, global int) ([]int, error) {
	if size <= 0 || offset < 0 || offset+size > global || step < 0 {
		return nil, fmt.Errorf("data: sampler: bad range [%d, %d) of a global batch of %d at step %d", offset, offset+size, global, step)
	}
	if global > s.n {
		return nil, fmt.Errorf("data: sampler: global batch %d exceeds the %d samples", global, s.n)
	}
	spe := int64(s.n / global)
	e := step / spe
	if e != s.epoch || global != s.global {
		s.perm = permutation(s.perm, model.MixSeed(s.seed, uint64(e)), s.n)
		s.epoch, s.global = e, global
	}
	lo := int(step%spe)*global + offset
	return append(dst[:0], s.perm[lo:lo+size]...), nil
}

// Shard is Sampler.Indices without the cached permutation.
func Shard(seed uint64, step int64, rank, world, batch, n int) ([]int, error) {
	return NewSampler(seed, n).Indices(nil, step, rank, world, batch)
}

// permutation returns a Fisher–Yates shuffle of [0, n) driven by splitmix64.
func permutation(p []int, seed uint64, n int) []int {
	p = p[:0]
	for i := 0; i < n; i++ {
		p = append(p, i)
	}
	state := seed
	for i := n - 1; i > 0; i-- {
		state += 0x9e3779b97f4a7c15
		z := state
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		j, _ := bits.Mul64(z, uint64(i+1))
		p[i], p[j] = p[j], p[i]
	}
	return p
}
