// Package telemetry is a training run's timeline: one Record per step,
// evaluation and cluster event, kept in a bounded in-memory History for the
// local API's page and written as JSON Lines for offline curves.
package telemetry

import (
	"math"
	"time"
)

// Kind says what a Record describes.
type Kind string

// The kinds of records.
const (
	// KindStep is one completed training step.
	KindStep Kind = "step"
	// KindEval is one evaluation on held-out data.
	KindEval Kind = "eval"
	// KindEvent is something that happened to the run or the ring.
	KindEvent Kind = "event"
)

// Event names of KindEvent records.
const (
	// EventEpoch: this peer adopted a ring epoch (Epoch, Peers, Peer is the coordinator).
	EventEpoch = "epoch"
	// EventMember: a member changed state (Peer; Message is "from → to").
	EventMember = "member"
	// EventStepFailed: a step failed and will be retried (Peer: the member blamed, if any).
	EventStepFailed = "step_failed"
	// EventExcluded: a member was excluded from ring epochs (Peer, Message: why).
	EventExcluded = "excluded"
	// EventResync: this peer replaced its state with a member's (Peer: the source).
	EventResync = "resync"
	// EventCheckpoint: a checkpoint was written (Message: its path).
	EventCheckpoint = "checkpoint"
	// EventResumed: the run resumed from a checkpoint (Step: its step;
	// Message: its path).
	EventResumed = "resumed"
	// EventDone: the run finished (Message: the done line).
	EventDone = "done"
	// EventEvalFailed: an evaluation through a pipeline failed (Peer: the
	// member blamed, if any; Message: why); training goes on.
	EventEvalFailed = "eval_failed"
)

// Record is one line of a run's timeline. Fields that do not apply to its
// Kind are left zero and omitted from JSON, except Step and Time. History
// and File leave out a figure that is not finite (a diverged loss).
type Record struct {
	// Seq numbers the records of one History from 1; 0 until added.
	Seq  uint64    `json:"seq,omitempty"`
	Time time.Time `json:"time"`
	Kind Kind      `json:"kind"`
	// Step is the number of completed steps when the record was made.
	Step uint64 `json:"step"`
	// Run names the run, for files that hold several (the peer's name).
	Run string `json:"run,omitempty"`

	// KindStep.
	Steps       uint64  `json:"steps,omitempty"`
	Loss        float64 `json:"loss,omitempty"`
	SamplesPerS float64 `json:"samples_per_s,omitempty"`
	// BytesSent is what this peer sent for the step: the all-reduce frames it
	// queued for its neighbours (and, on a pipeline stage, the activations,
	// their gradients and the tied table it wrote).
	BytesSent float64 `json:"bytes_sent,omitempty"`
	// StepS is the step's wall time: ComputeS + AllreduceS.
	StepS float64 `json:"step_s,omitempty"`
	// ComputeS is forward, backward and the optimizer on this peer.
	ComputeS float64 `json:"compute_s,omitempty"`
	// AllreduceS is communication not hidden behind backward: from the
	// end of backward until the averaged gradient was in.
	AllreduceS float64 `json:"allreduce_s,omitempty"`
	// WaitS is time since the previous step spent outside any step:
	// waiting for a ring epoch or members, state sync, failed attempts.
	WaitS float64 `json:"wait_s,omitempty"`
	Codec string  `json:"codec,omitempty"`
	Peers int     `json:"peers,omitempty"`
	Epoch uint64  `json:"epoch,omitempty"`

	// KindEval. EvalS is the evaluation's time, which the next step's
	// WaitS leaves out.
	TestLoss    *float64 `json:"test_loss,omitempty"`
	Accuracy    *float64 `json:"accuracy,omitempty"`
	BitsPerByte *float64 `json:"bits_per_byte,omitempty"`
	EvalS       float64  `json:"eval_s,omitempty"`

	// KindEvent.
	Event   string `json:"event,omitempty"`
	Peer    string `json:"peer,omitempty"`
	Message string `json:"msg,omitempty"`
}

// Sink receives records as they are made. Implementations must be safe
// for concurrent use and must not block for long.
type Sink interface {
	Add(Record)
}

// Tee is a Sink that passes every record to each of its sinks in order.
type Tee []Sink

// Add implements Sink.
func (t Tee) Add(r Record) {
	for _, s := range t {
		s.Add(r)
	}
}

// finite returns r with its non-finite figures (NaN, ±Inf: a diverged
// loss) left out, as JSON has no way to write them: zero for the plain
// fields, which JSON then omits, nil for the pointers.
func (r Record) finite() Record {
	for _, f := range []*float64{&r.Loss, &r.SamplesPerS, &r.BytesSent, &r.StepS, &r.ComputeS, &r.AllreduceS, &r.WaitS} {
		if math.IsNaN(*f) || math.IsInf(*f, 0) {
			*f = 0
		}
	}
	for _, p := range []**float64{&r.TestLoss, &r.Accuracy, &r.BitsPerByte} {
		if *p != nil && (math.IsNaN(**p) || math.IsInf(**p, 0)) {
			*p = nil
		}
	}
	return r
}
