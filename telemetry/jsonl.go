package telemetry

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// File is a Sink that appends each record to a file as one JSON object per
// line (JSON Lines). Write errors are kept: the first is returned by Close.
type File struct {
	mu   sync.Mutex
	f    *os.File
	w    *bufio.Writer
	enc  *json.Encoder
	path string
	err  error
	run  string
}

// CreateFile creates (or truncates) path for records of run run (written
// into records that name no run).
func CreateFile(path, run string) (*File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("telemetry: metrics file: %w", err)
	}
	w := bufio.NewWriter(f)
	return &File{f: f, w: w, enc: json.NewEncoder(w), path: path, run: run}, nil
}

// Add implements Sink. Records are flushed to the file at once, so a run
// that is killed loses at most the line being written.
func (m *File) Add(r Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return
	}
	if r.Run == "" {
		r.Run = m.run
	}
	r = r.finite()
	r.Seq = 0 // a History's numbering means nothing in a file
	if err := m.enc.Encode(r); err != nil {
		m.err = fmt.Errorf("telemetry: writing %s: %w", m.path, err)
		return
	}
	if err := m.w.Flush(); err != nil {
		m.err = fmt.Errorf("telemetry: writing %s: %w", m.path, err)
	}
}

// Close closes the file and returns the first error met while writing.
func (m *File) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return errors.Join(m.err, m.f.Close())
}

// ReadFile reads the records of a JSON Lines file written by File. A line
// that is not a record is an error naming its line number; a last line cut
// short (a run killed while writing) is ignored.
func ReadFile(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	defer f.Close()
	return Read(f, path)
}

// Read reads JSON Lines records from r; name labels errors.
func Read(r io.Reader, name string) ([]Record, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var out []Record
	var pending error
	for line := 1; sc.Scan(); line++ {
		if pending != nil {
			return nil, pending
		}
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var rec Record
		if err := json.Unmarshal(b, &rec); err != nil {
			pending = fmt.Errorf("telemetry: %s line %d: not a metrics record: %w", name, line, err)
			continue
		}
		if rec.Kind != KindStep && rec.Kind != KindEval && rec.Kind != KindEvent {
			return nil, fmt.Errorf("telemetry: %s line %d: unknown record kind %q", name, line, rec.Kind)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("telemetry: reading %s: %w", name, err)
	}
	if pending != nil && len(out) == 0 {
		return nil, pending // not a metrics file at all
	}
	return out, nil
}
