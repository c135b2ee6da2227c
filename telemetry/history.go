package telemetry

import (
	"sync"
	"time"
)

// History keeps the latest records in a bounded ring buffer. It is safe
// for concurrent use.
type History struct {
	mu   sync.Mutex
	buf  []Record
	next uint64 // Seq of the next record
	now  func() time.Time
}

// NewHistory returns a History that keeps the last capacity records
// (at least one).
func NewHistory(capacity int) *History {
	return &History{buf: make([]Record, max(capacity, 1)), next: 1, now: time.Now}
}

// Add implements Sink: it numbers r, stamps it with the time if it has
// none, and drops the oldest record when the buffer is full.
func (h *History) Add(r Record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.Time.IsZero() {
		r.Time = h.now()
	}
	r = r.finite()
	r.Seq = h.next
	h.buf[h.next%uint64(len(h.buf))] = r
	h.next++
}

// Since returns the records with Seq above seq still held, oldest first,
// and the highest Seq handed out so far (pass it to the next call to get
// only newer records). Records dropped from a full buffer are gone: a
// reader that falls behind sees a gap in Seq.
func (h *History) Since(seq uint64) ([]Record, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	last := h.next - 1
	first := uint64(1)
	if n := uint64(len(h.buf)); last > n {
		first = last - n + 1
	}
	first = max(first, seq+1)
	out := make([]Record, 0, last+1-min(first, last+1))
	for s := first; s <= last; s++ {
		out = append(out, h.buf[s%uint64(len(h.buf))])
	}
	return out, last
}
