package bridge

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"unsafe"
)

// shm is the shared-memory file of one session: the gradient region then
// the parameter region, n float32 values each.
type shm struct {
	path  string
	mem   []byte
	grads []float32 // [0, 4n): gradients in, averages out
	param []float32 // [4n, 8n): the process's parameters when it last hashed them
}

// shmDir is where shared-memory files go: /dev/shm (a tmpfs) when it
// exists, else fallback.
func shmDir(fallback string) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return fallback
}

// newSHM creates and maps a file of 8n bytes at path (mode 0600; it must
// not exist).
func newSHM(path string, n int) (*shm, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("bridge: shared memory: %w", err)
	}
	defer f.Close()
	size := 8 * int64(n)
	if err := f.Truncate(size); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("bridge: shared memory of %d bytes: %w", size, err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("bridge: mapping %s: %w", path, err)
	}
	all := unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), 2*n) // little-endian hosts only (amd64, arm64)
	return &shm{path: path, mem: mem, grads: all[:n:n], param: all[n:]}, nil
}

// close unmaps and removes the file.
func (s *shm) close() error {
	err := syscall.Munmap(s.mem)
	s.mem, s.grads, s.param = nil, nil, nil
	if rerr := os.Remove(s.path); rerr != nil && !os.IsNotExist(rerr) && err == nil {
		err = rerr
	}
	return err
}

// stateFile creates an empty file for one state transfer beside the
// shared memory, mode 0600, and returns its path.
func stateFile(dir, prefix string, seq uint64) (string, error) {
	path := filepath.Join(dir, fmt.Sprintf("%s-state-%d", prefix, seq))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("bridge: state file: %w", err)
	}
	return path, f.Close()
}
