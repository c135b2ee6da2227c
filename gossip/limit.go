package gossip

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Rate limits on the messages of one author: an honest peer sends one
// heartbeat per interval, at most minBeatDivisor more when its payload
// changes, and rarely an epoch or a departure; rateBurst and ratePerInterval
// leave twice that room. Messages beyond are ignored (not forwarded).
const (
	ratePerInterval = 2 * (minBeatDivisor + 2)
	rateBurst       = 2 * ratePerInterval
	// maxLimited bounds the authors the limiter remembers; past it, authors
	// whose bucket has refilled are forgotten.
	maxLimited = 1024
)

// limiter is a token bucket per message author.
type limiter struct {
	mu      sync.Mutex
	per     time.Duration // time to earn one token
	burst   float64
	buckets map[peer.ID]*tokens
}

type tokens struct {
	n    float64
	last time.Time
}

// newLimiter allows each author rate messages per interval, with bursts of burst.
func newLimiter(rate int, interval time.Duration, burst int) *limiter {
	return &limiter{per: interval / time.Duration(rate), burst: float64(burst), buckets: map[peer.ID]*tokens{}}
}

// allow takes a token of author p at now; false when p has none left.
func (l *limiter) allow(p peer.ID, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[p]
	if b == nil {
		if len(l.buckets) >= maxLimited {
			l.forget(now)
		}
		b = &tokens{n: l.burst, last: now}
		l.buckets[p] = b
	}
	if now.After(b.last) {
		b.n = min(l.burst, b.n+float64(now.Sub(b.last))/float64(l.per))
		b.last = now
	}
	if b.n < 1 {
		return false
	}
	b.n--
	return true
}

// forget drops the buckets that are full again at now. Callers hold l.mu.
func (l *limiter) forget(now time.Time) {
	for p, b := range l.buckets {
		if b.n+float64(now.Sub(b.last))/float64(l.per) >= l.burst {
			delete(l.buckets, p)
		}
	}
}
