package allreduce

import (
	"sync"
	"sync/atomic"
)

// floatPool is a free list of float32 buffers that a session's rounds
// reuse: a step's scratch (the round's per-bucket result, each bucket's
// decode scratch) is as large as the gradient, and allocating it anew every
// step made the garbage collector run about once a step in a process with
// a small heap (the PyTorch bridge's daemon), at a cost of milliseconds.
// Buffers come back with stale contents: a caller writes all of a buffer
// before it reads any.
type floatPool struct {
	mu   sync.Mutex
	free [][]float32
}

// maxPooled bounds the buffers a pool keeps (a round holds two per bucket).
const maxPooled = 64

// get returns a buffer of length n, reused when one of that length is free.
func (p *floatPool) get(n int) []float32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.free) - 1; i >= 0; i-- {
		if b := p.free[i]; len(b) == n {
			p.free[i] = p.free[len(p.free)-1]
			p.free = p.free[:len(p.free)-1]
			return b
		}
	}
	return make([]float32, n)
}

// put gives b back for reuse; the caller must not touch it afterwards.
func (p *floatPool) put(b []float32) {
	if b == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < maxPooled {
		p.free = append(p.free, b)
	}
}

// framePool is a free list of frame buffers: the frames a session encodes
// and the frames its transport reads (FrameReceiver). A fresh buffer of a
// few hundred KiB costs page faults and zeroing on every frame (a quarter
// of a daemon's CPU time per byte on a 1 Gbit/s ring before the pool); a
// recycled one is warm. Buffers come back with stale contents: every
// codec writes every byte of its encoding (TestCodecsIgnoreStaleBytes).
type framePool struct {
	mu    sync.Mutex
	free  [][]byte
	bytes int
}

// maxPooledFrameBytes bounds the bytes a framePool keeps.
const maxPooledFrameBytes = 64 << 20

// get returns a buffer of length n, reused when a free one has room for n
// and is at most twice as large.
func (p *framePool) get(n int) []byte {
	p.mu.Lock()
	for i := len(p.free) - 1; i >= 0; i-- {
		if b := p.free[i]; cap(b) >= n && cap(b) <= 2*n {
			p.free[i] = p.free[len(p.free)-1]
			p.free = p.free[:len(p.free)-1]
			p.bytes -= cap(b)
			p.mu.Unlock()
			return b[:n]
		}
	}
	p.mu.Unlock()
	return make([]byte, n)
}

// framePoisoning makes framePool.put overwrite what it takes back (tests).
var framePoisoning atomic.Bool

// put gives b back for reuse; the caller must not touch it afterwards.
func (p *framePool) put(b []byte) {
	if cap(b) == 0 {
		return
	}
	if framePoisoning.Load() {
		b = b[:cap(b)]
		for i := range b {
			b[i] = 0xFF
		}
	}
	p.mu.Lock()
	if p.bytes+cap(b) <= maxPooledFrameBytes {
		p.free = append(p.free, b[:0])
		p.bytes += cap(b)
	}
	p.mu.Unlock()
}
