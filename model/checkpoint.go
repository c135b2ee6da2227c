package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrNoCheckpoint reports a checkpoint directory without checkpoints.
var ErrNoCheckpoint = errors.New("model: no checkpoint")

// ErrBadCheckpoint reports a corrupt or truncated checkpoint file.
var ErrBadCheckpoint = errors.New("model: corrupt checkpoint")

// ErrCheckpointMismatch reports a checkpoint written under another configuration.
var ErrCheckpointMismatch = errors.New("model: checkpoint config mismatch")

// DefaultKeepCheckpoints is how many checkpoints WriteCheckpoint keeps.
const DefaultKeepCheckpoints = 3

const (
	ckptMagic  = "P2PTCKP1"
	ckptPrefix = "ckpt-"
	ckptSuffix = ".p2pt"
	// maxSection bounds a section's declared length (4 GiB).
	maxSection = 1 << 32
)

// Checkpoint is a training state: parameters, optimizer state, the step to
// run next and the hash of the configuration that produced them.
type Checkpoint struct {
	// Step is the number of completed training steps.
	Step int64
	// ConfigHash identifies the configuration (see ConfigHash).
	ConfigHash [32]byte
	// Params are little-endian fp32 parameter bytes (Model.ParamBytes).
	Params []byte
	// Optimizer is the optimizer state (Optimizer.State).
	Optimizer []byte
}

// ConfigHash hashes the parts that must agree for a checkpoint to be resumed
// (for example the model Signature, the optimizer settings and the seed).
func ConfigHash(parts ...string) [32]byte {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// Marshal encodes the checkpoint: magic, step, config hash, the two
// length-prefixed sections, and a SHA-256 of everything before it.
func (c *Checkpoint) Marshal() []byte {
	b := make([]byte, 0, len(ckptMagic)+8+32+16+len(c.Params)+len(c.Optimizer)+32)
	b = append(b, ckptMagic...)
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Step))
	b = append(b, c.ConfigHash[:]...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(c.Params)))
	b = append(b, c.Params...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(c.Optimizer)))
	b = append(b, c.Optimizer...)
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

// UnmarshalCheckpoint decodes and verifies Marshal's output.
func UnmarshalCheckpoint(b []byte) (*Checkpoint, error) {
	if len(b) < len(ckptMagic)+8+32+8+8+32 {
		return nil, fmt.Errorf("%w: %d bytes is too short", ErrBadCheckpoint, len(b))
	}
	if string(b[:len(ckptMagic)]) != ckptMagic {
		return nil, fmt.Errorf("%w: wrong magic", ErrBadCheckpoint)
	}
	body, sum := b[:len(b)-32], b[len(b)-32:]
	if got := sha256.Sum256(body); string(got[:]) != string(sum) {
		return nil, fmt.Errorf("%w: checksum mismatch (truncated or damaged)", ErrBadCheckpoint)
	}
	r := body[len(ckptMagic):]
	c := &Checkpoint{Step: int64(binary.LittleEndian.Uint64(r))}
	if c.Step < 0 {
		return nil, fmt.Errorf("%w: negative step", ErrBadCheckpoint)
	}
	copy(c.ConfigHash[:], r[8:40])
	r = r[40:]
	section := func(what string) ([]byte, error) {
		if len(r) < 8 {
			return nil, fmt.Errorf("%w: %s length missing", ErrBadCheckpoint, what)
		}
		n := binary.LittleEndian.Uint64(r)
		r = r[8:]
		if n > maxSection || n > uint64(len(r)) {
			return nil, fmt.Errorf("%w: %s section of %d bytes exceeds the %d left", ErrBadCheckpoint, what, n, len(r))
		}
		s := r[:n:n]
		r = r[n:]
		return s, nil
	}
	var err error
	if c.Params, err = section("parameter"); err != nil {
		return nil, err
	}
	if c.Optimizer, err = section("optimizer"); err != nil {
		return nil, err
	}
	if len(r) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrBadCheckpoint, len(r))
	}
	return c, nil
}

// CheckpointPath returns the file name WriteCheckpoint uses for step in dir.
func CheckpointPath(dir string, step int64) string {
	return filepath.Join(dir, fmt.Sprintf("%s%012d%s", ckptPrefix, step, ckptSuffix))
}

// WriteCheckpoint writes c atomically into dir (created if needed): a temp
// file in dir is written and fsynced, renamed to CheckpointPath, and the
// directory fsynced. Then all but the newest keep checkpoints are removed
// (keep ≤ 0 means DefaultKeepCheckpoints). It returns the path written.
func WriteCheckpoint(dir string, c *Checkpoint, keep int) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("model: checkpoint dir: %w", err)
	}
	path := CheckpointPath(dir, c.Step)
	tmp, err := os.CreateTemp(dir, ".ckpt-*.tmp")
	if err != nil {
		return "", fmt.Errorf("model: checkpoint: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(c.Marshal()); err != nil {
		return "", fmt.Errorf("model: writing checkpoint %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return "", fmt.Errorf("model: syncing checkpoint %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("model: closing checkpoint %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("model: checkpoint: %w", err)
	}
	done = true
	if d, err := os.Open(dir); err == nil {
		d.Sync() // best effort: not every file system syncs directories
		d.Close()
	}
	if keep <= 0 {
		keep = DefaultKeepCheckpoints
	}
	steps, err := listCheckpoints(dir)
	if err == nil && len(steps) > keep {
		for _, s := range steps[:len(steps)-keep] {
			os.Remove(CheckpointPath(dir, s))
		}
	}
	return path, nil
}

// listCheckpoints returns the steps of dir's checkpoint files, ascending.
func listCheckpoints(dir string) ([]int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var steps []int64
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, ckptPrefix) || !strings.HasSuffix(name, ckptSuffix) {
			continue
		}
		s, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(name, ckptPrefix), ckptSuffix), 10, 64)
		if err != nil || s < 0 {
			continue
		}
		steps = append(steps, s)
	}
	slices.Sort(steps)
	return steps, nil
}

// ReadCheckpoint reads and verifies one checkpoint file; when wantHash is not
// nil, a checkpoint written under another configuration is ErrCheckpointMismatch.
func ReadCheckpoint(path string, wantHash *[32]byte) (*Checkpoint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	c, err := UnmarshalCheckpoint(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if wantHash != nil && c.ConfigHash != *wantHash {
		return nil, fmt.Errorf("%w: %s was written with config %s, this run has %s", ErrCheckpointMismatch, path,
			hex.EncodeToString(c.ConfigHash[:8]), hex.EncodeToString(wantHash[:8]))
	}
	return c, nil
}

// LoadLatestCheckpoint reads the checkpoint with the highest step in dir.
// It returns ErrNoCheckpoint (wrapped) when there is none, and an error when
// the latest is corrupt or from another configuration: it never silently
// falls back to an older one.
func LoadLatestCheckpoint(dir string, wantHash *[32]byte) (*Checkpoint, error) {
	steps, err := listCheckpoints(dir)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(steps) == 0) {
		return nil, fmt.Errorf("%w in %s", ErrNoCheckpoint, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("model: checkpoint dir: %w", err)
	}
	return ReadCheckpoint(CheckpointPath(dir, steps[len(steps)-1]), wantHash)
}

// LatestCheckpoint returns the path of the checkpoint with the highest step
// in dir and the step it holds, reading only its header (its magic and
// step; ReadCheckpoint verifies the rest). It returns ErrNoCheckpoint
// (wrapped) when there is none, and ErrBadCheckpoint when the header is
// not a checkpoint's.
func LatestCheckpoint(dir string) (path string, step int64, err error) {
	steps, err := listCheckpoints(dir)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(steps) == 0) {
		return "", 0, fmt.Errorf("%w in %s", ErrNoCheckpoint, dir)
	}
	if err != nil {
		return "", 0, fmt.Errorf("model: checkpoint dir: %w", err)
	}
	path = CheckpointPath(dir, steps[len(steps)-1])
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("model: %w", err)
	}
	defer f.Close()
	var head [len(ckptMagic) + 8]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		return "", 0, fmt.Errorf("%s: %w: reading its header: %v", path, ErrBadCheckpoint, err)
	}
	if string(head[:len(ckptMagic)]) != ckptMagic {
		return "", 0, fmt.Errorf("%s: %w: wrong magic", path, ErrBadCheckpoint)
	}
	step = int64(binary.LittleEndian.Uint64(head[len(ckptMagic):]))
	if step < 0 {
		return "", 0, fmt.Errorf("%s: %w: negative step", path, ErrBadCheckpoint)
	}
	return path, step, nil
}

// Checkpoint captures the model's parameters and o's state after step
// completed steps.
func (m *Model) Checkpoint(o *Optimizer, step int64, configHash [32]byte) *Checkpoint {
	c := &Checkpoint{Step: step, ConfigHash: configHash, Params: m.ParamBytes()}
	if o != nil {
		c.Optimizer = o.State()
	}
	return c
}

// Restore loads a checkpoint's parameters into the model (and every replica)
// and its optimizer state into o (when o is not nil).
func (m *Model) Restore(c *Checkpoint, o *Optimizer) error {
	if len(c.Params) != 4*len(m.params) {
		return fmt.Errorf("model: restoring step %d: %w: %d parameter bytes, model has %d", c.Step, ErrBadState, len(c.Params), 4*len(m.params))
	}
	if o != nil {
		if err := o.SetState(c.Optimizer); err != nil {
			return fmt.Errorf("model: restoring step %d: %w", c.Step, err)
		}
	}
	return m.SetParamBytes(c.Params)
}
