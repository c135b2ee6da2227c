package allreduce

import (
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Schedule names how a bucket's all-reduce moves data (config key `schedule`).
type Schedule string

// Schedules. ScheduleAuto picks the class default: ring for linear,
// shared-scale and low-rank codecs, direct for quantized and error-feedback
// codecs, all-gather for sparse codecs.
const (
	ScheduleAuto Schedule = ""
	// ScheduleRing: ring reduce-scatter then all-gather of the owners' bytes.
	// Quantized codecs decode → sum → re-encode at every hop. Error-feedback
	// codecs do not support it and use ScheduleDirect.
	ScheduleRing Schedule = "ring"
	// ScheduleDirect: two-phase; every peer sends each chunk straight to its
	// owner, the owner sums in fp32 (or integers) and encodes once, then sends
	// its bytes to every peer.
	ScheduleDirect Schedule = "direct"
	// ScheduleAllGather: every peer's encoded bucket reaches every peer
	// (forwarded around the ring); all decode-add in rank order and divide by
	// W. Always used for sparse codecs; optional for error-feedback codecs.
	ScheduleAllGather Schedule = "allgather"
	// ScheduleProportional: ScheduleDirect with uneven owner shares
	// (Config.Shares, from Shares or Choose) so slow peers own less.
	ScheduleProportional Schedule = "proportional"
	// ScheduleHierarchical: two-level all-reduce for linear codecs (other
	// classes use their default): reduce-scatter inside groups of
	// consecutive peers, an all-reduce of each owned part across the
	// groups, and an all-gather inside the groups (hierReduce). Its latency
	// term is 2(g−1) + 2(G−1) link latencies for G groups of g instead of
	// the ring's 2(W−1), for the same bytes per peer. "hier" takes
	// DefaultGroups; "hier-16x16" names the group sizes in ring order
	// (HierarchicalSchedule, Schedule.Groups).
	ScheduleHierarchical Schedule = "hier"
)

// ParseSchedule validates a config string.
func ParseSchedule(s string) (Schedule, error) {
	switch Schedule(s) {
	case ScheduleAuto, ScheduleRing, ScheduleDirect, ScheduleAllGather, ScheduleProportional, ScheduleHierarchical:
		return Schedule(s), nil
	case "auto":
		return ScheduleAuto, nil
	}
	if strings.HasPrefix(s, hierPrefix) {
		g, err := parseGroups(s)
		if err != nil {
			return "", err
		}
		return HierarchicalSchedule(g), nil
	}
	return "", fmt.Errorf("%w: schedule %q (want ring, direct, allgather, proportional, hier, hier-SIZExCOUNT… or auto)", ErrConfig, s)
}

// Defaults.
const (
	// DefaultChunkBytes is the pipeline chunk: fp32 bytes of the buffer per frame.
	DefaultChunkBytes = 256 << 10
	// DefaultBucketBytes is the suggested fusion bucket size (fp32 bytes).
	DefaultBucketBytes = 25 << 20
	// DefaultConcurrency is the number of buckets reduced at once.
	DefaultConcurrency = 2
	// DefaultTimeoutFloor is the smallest derived frame deadline.
	DefaultTimeoutFloor = 10 * time.Second
	// DefaultTimeoutSlack multiplies the expected transfer time of a bucket
	// to derive the frame deadline.
	DefaultTimeoutSlack = 4
	// TimeoutCeiling is the largest derived frame deadline, whatever the
	// bandwidth figure: a member that gossips a tiny link speed cannot
	// stretch every deadline to days.
	TimeoutCeiling = 10 * time.Minute
	// DefaultMaxBufferedBytes is the default Config.MaxBufferedBytes: room
	// for a peer running one step ahead with a large model.
	DefaultMaxBufferedBytes = 1 << 30
)

// Config configures a Session. The zero value is usable.
type Config struct {
	// ChunkBytes is the pipeline chunk size in fp32 bytes (default DefaultChunkBytes).
	ChunkBytes int
	// MaxFrameBytes bounds every frame (header + payload); the Transport must
	// refuse longer frames before allocating them. Default MaxFrame().
	MaxFrameBytes int
	// Schedule selects the schedule (default ScheduleAuto).
	Schedule Schedule
	// Shares are the owner shares per rank for ScheduleProportional (length W,
	// non-negative, sum 1); nil means equal shares.
	Shares []float64
	// Concurrency bounds the buckets of a round reduced at once (default 2).
	Concurrency int
	// FrameTimeout is the deadline for each awaited frame. 0 derives it per
	// bucket: max(TimeoutFloor, min(TimeoutCeiling, DefaultTimeoutSlack · 2 ·
	// bucket bytes / Bandwidth)).
	// A peer that has already received part of the bucket waits up to one
	// more FrameTimeout in proportion to its progress before blaming its
	// upstream peer (so the stalled peer's direct neighbour reports first):
	// a failure is reported within 2·FrameTimeout.
	FrameTimeout time.Duration
	// TimeoutFloor is the smallest derived deadline (default DefaultTimeoutFloor).
	TimeoutFloor time.Duration
	// Bandwidth is the measured bandwidth of the slowest link in bytes/s
	// (0: unknown, the deadline is TimeoutFloor).
	Bandwidth float64
	// MaxBufferedBytes bounds, per peer, the bytes of frames received and
	// not yet consumed (default DefaultMaxBufferedBytes, at least one
	// frame): a peer that sends more fails the session and is named.
	MaxBufferedBytes int
	// Robust, when enabled, combines the members' contributions to
	// linear, quantized and error-feedback buckets with centered clipping
	// at each part's owner (the direct schedule) instead of their mean.
	Robust *Robust
	// Logger receives failure reasons (default zap.NewNop()).
	Logger *zap.Logger
}

func (c Config) withDefaults() Config {
	if c.ChunkBytes <= 0 {
		c.ChunkBytes = DefaultChunkBytes
	}
	if c.ChunkBytes < 4 {
		c.ChunkBytes = 4
	}
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = c.MaxFrame()
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.TimeoutFloor <= 0 {
		c.TimeoutFloor = DefaultTimeoutFloor
	}
	if c.MaxBufferedBytes <= 0 {
		c.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if c.MaxBufferedBytes < c.MaxFrameBytes {
		c.MaxBufferedBytes = c.MaxFrameBytes
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

// MaxFrame returns the maximum frame size a Transport must accept:
// MaxFrameBytes if set, else 4·ChunkBytes + 64 KiB (at least 1 MiB), which
// covers every codec's encoding of one chunk.
func (c Config) MaxFrame() int {
	if c.MaxFrameBytes > 0 {
		return c.MaxFrameBytes
	}
	cb := c.ChunkBytes
	if cb <= 0 {
		cb = DefaultChunkBytes
	}
	m := 4*cb + 64<<10
	if m < 1<<20 {
		m = 1 << 20
	}
	return m
}

func (c Config) frameTimeout(bucketBytes int) time.Duration {
	if c.FrameTimeout > 0 {
		return c.FrameTimeout
	}
	d := c.TimeoutFloor
	if c.Bandwidth > 0 {
		secs := min(float64(DefaultTimeoutSlack)*2*float64(bucketBytes)/c.Bandwidth, TimeoutCeiling.Seconds())
		if t := time.Duration(secs * float64(time.Second)); t > d {
			d = t
		}
	}
	return d
}
