package allreduce

import "sync"

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
