package train

import (
	"context"

	"github.com/p2ptrain/p2ptrain/allreduce"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/plan"
)

// Cluster is what the trainer needs of the running peer. package node
// implements it; its methods are safe for concurrent use.
type Cluster interface {
	// Self returns this peer's ID.
	Self() string
	// View returns the known members, sorted by peer ID, and the adopted
	// ring epoch.
	View() ([]gossip.Member, gossip.Epoch)
	// Announce sets this peer's heartbeat payload and step, and sends a
	// heartbeat now.
	Announce(payload []byte, step uint64)
	// RequestEpoch asks the coordinator for a ring epoch numbered above
	// current (a failed round needs a fresh ring).
	RequestEpoch(current uint64)
	// Exclude keeps peer out of the ring epochs this peer proposes or
	// follows for a back-off, saying why (a member blamed for consecutive
	// failed steps, or one that never got ready).
	Exclude(peer, reason string)
	// Commit tells the peer that a step completed in ring epoch number:
	// later epochs need a majority of that ring's members.
	Commit(number uint64)
	// LinkMatrix returns the measured throughput between the peers of order
	// (plan.LinkMatrix of this peer's and the members' figures).
	LinkMatrix(order []string) plan.Matrix
	// OpenTransport returns the all-reduce transport of one ring epoch.
	OpenTransport(ep allreduce.Ring) allreduce.EpochTransport
	// FetchState downloads peer's training state after step completed
	// steps, refusing more than max bytes.
	FetchState(ctx context.Context, peer string, step, max uint64) ([]byte, error)
	// ServeState serves this peer's training state from src (nil stops).
	// src learns which peer asks (a peer ID string).
	ServeState(src func(from string, step uint64) ([]byte, error))
}

// StageStates is a Cluster that carries single pipeline stages' states
// (node.Node): under train.pipeline_stages = "auto", the holders of a
// pipeline's stages that the coordinator re-plans into another layout
// join the stages' states, fetched from each other, into the whole
// model's.
type StageStates interface {
	// FetchStageState downloads stage's state after step completed steps
	// from peer, refusing more than max bytes.
	FetchStageState(ctx context.Context, peer string, step uint64, stage int, max uint64) ([]byte, error)
	// ServeStageState serves stages' states from src (nil stops).
	ServeStageState(src func(from string, step uint64, stage int) ([]byte, error))
}

// Status is what the trainer reports after every change, for /status and
// /metrics.
type Status struct {
	Active       bool
	Step, Steps  uint64
	Loss         float64 // training loss of the last step; negative before the first
	Accuracy     float64 // last test accuracy; negative before the first evaluation
	ParamHash    string
	SamplesPerS  float64
	BytesPerStep float64
	Codec        string
	// Waiting says why the trainer is waiting for a ring it can train in
	// ("" while it trains, or waits on nothing it can name).
	Waiting string
}
