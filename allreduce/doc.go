// Package allreduce averages gradient buckets across the peers of a ring
// epoch, bit-identically on every peer, in compressed form.
//
// # Contract
//
// Given a Ring (epoch number, ordered peers, self) and a Transport for it,
// NewSession starts a Session. Each training step, the caller opens a Round,
// Adds its fusion buckets as they become ready (backward order, the same
// order and IDs on every peer) and Waits. On success every peer's Out holds
// the same bits: the average over all peers of Data, as decoded from the
// bytes produced by the owner of each region (the last phase always ships
// the owner's encoded bytes, and every peer — the owner too — decodes those
// bytes). Summation order is fixed by the epoch.
//
// On failure (a broken link, a frame later than the deadline, an invalid or
// wrong-epoch frame, a canceled context) the Round returns a *PeerError that
// names the responsible peer and wraps one of ErrPeerFailed, ErrTimeout,
// ErrEpochMismatch, ErrBadFrame, ErrCodecMismatch, ErrFrameTooLarge or
// ErrAborted; no Out is written; the Session sends an abort notice to every
// peer and resets its Transport, so every peer's round fails promptly with
// the same culprit. A failed Session stays failed: retry the step in the next
// epoch with a new Session (and Reset error-feedback codecs, ResetShared
// low-rank codecs). Close stops every goroutine the Session started.
//
// # Schedules (docs/codecs.md)
//
// Each bucket is cut into W segments (owner shares; equal unless
// ScheduleProportional) and each segment into pipeline chunks of
// Config.ChunkBytes fp32 bytes, or fewer so that a small segment still has
// pipelineChunks chunks of at least minChunkElems values (layout.go); one
// frame carries one chunk. A writer
// goroutine per peer sends while the bucket's goroutine decodes and sums and
// a reader goroutine per peer receives, so the stages overlap.
//
//   - compress.ClassLinear (none, fp16, bf16): ring reduce-scatter, each hop
//     decodes, adds its fp32 data and re-encodes; the owner divides by W and
//     encodes once; ring all-gather of the owner's bytes.
//   - compress.ClassSharedScale (sint8): a MAX all-reduce of the per-block
//     scales (sub-phase 1, always the direct schedule: 2 hops), then the ring sums integer payloads
//     (AddEncoded); chunks are aligned to SharedScaler.Block().
//   - compress.ClassLowRank (powersgd, acpsgd): LowRank.Rounds() raw fp32
//     SUM all-reduces of the factors (sub-phase = round).
//   - compress.ClassQuantized (int8, dyn8, qsgd): ScheduleDirect by default
//     (each chunk goes to its owner, which sums in fp32 in rank order and
//     encodes once) or ScheduleRing (decode → sum → re-encode per hop).
//   - compress.ClassErrorFeedback (onebit, sign): ScheduleDirect with the
//     local encode applying feedback (Pos.Feedback) and the owner's
//     re-encode not; or ScheduleAllGather.
//   - compress.ClassSparse (topk): ScheduleAllGather: every peer's payloads
//     travel around the ring; all peers DecodeAdd them in rank order and
//     divide by W.
//
// ScheduleHierarchical ("hier", or "hier-16x16" naming the groups) runs
// linear codecs in two levels over groups of consecutive peers:
// reduce-scatter inside each group, a ring all-reduce of each owned part
// among its owners in every group, all-gather of the final bytes inside the
// group. It moves the ring's bytes with 2(g−1) + 2(G−1) latency-bound steps
// instead of 2(W−1) (docs/scale.md has the α–β model, model.go computes
// it; plan.ChooseHierarchical picks the groups from measured RTTs).
//
// ScheduleProportional is the direct schedule with owner shares from
// Shares (water-filling on the peers' rates) so a slow peer owns little or
// nothing; Choose picks it over the ring from a bandwidth Matrix, and
// RingOrder orders the ring to maximise its slowest edge. EdgeCodec and
// EdgeCodecs pick stronger codecs of the same family for slower links;
// Bucket.Links hands them to the ring schedule of linear and quantized
// codecs (each reduce-scatter hop uses its edge's codec, the owner's bytes
// use the slowest edge's codec).
//
// # Frames
//
// Every frame has a 36-byte Header (version, phase, codec id, epoch, step,
// bucket, chunk, payload length) and a payload of at most
// Config.MaxFrame() − HeaderSize bytes. Frames are validated before use;
// an invalid frame fails the round, never panics, and never makes this
// package allocate past the maximum frame.
//
// The package imports no networking code: package protocol/ringstream
// implements Transport over libp2p streams (WriteFrame/ReadFrame framing), memtransport
// implements it in memory, allreducebench benchmarks over shaped memtransport
// links.
package allreduce
