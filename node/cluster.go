package node

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/plan"
	"github.com/p2ptrain/p2ptrain/protocol/probe"
	"github.com/p2ptrain/p2ptrain/protocol/statesync"
)

// This file is what a trainer uses of the node (package train's Cluster).

// Self returns the peer ID as a string.
func (n *Node) Self() string { return n.host.ID().String() }

// View returns the known members, sorted by peer ID, and the adopted ring epoch.
func (n *Node) View() ([]gossip.Member, gossip.Epoch) { return n.gsp.Snapshot() }

// Announce sets the application payload and the step this peer's
// heartbeats carry, and sends a heartbeat now.
func (n *Node) Announce(payload []byte, step uint64) {
	n.mu.Lock()
	n.app, n.step = payload, step
	n.mu.Unlock()
	n.gsp.Beat()
}

// RequestEpoch asks the coordinator for a ring epoch numbered above current.
func (n *Node) RequestEpoch(current uint64) {
	n.mu.Lock()
	n.wantEpoch = current
	n.mu.Unlock()
	n.gsp.Beat()
}

// Exclude keeps peer out of the ring epochs this peer's view proposes or
// follows, for a back-off (gossip.Service.Exclude).
func (n *Node) Exclude(peer, reason string) { n.gsp.Exclude(peer, reason) }

// Commit records that this peer completed a step in ring epoch number
// (gossip.Service.Commit).
func (n *Node) Commit(number uint64) { n.gsp.Commit(number) }

// FetchState downloads peer's training state after step completed steps
// (statesync.Fetch), refusing more than max bytes.
func (n *Node) FetchState(ctx context.Context, p string, step, max uint64) ([]byte, error) {
	id, err := n.stateSource(p)
	if err != nil {
		return nil, err
	}
	return statesync.Fetch(ctx, n.host, id, step, max)
}

// FetchStageState downloads pipeline stage stage's state after step
// completed steps from peer p (statesync.FetchStage), refusing more than
// max bytes.
func (n *Node) FetchStageState(ctx context.Context, p string, step uint64, stage int, max uint64) ([]byte, error) {
	id, err := n.stateSource(p)
	if err != nil {
		return nil, err
	}
	return statesync.FetchStage(ctx, n.host, id, step, stage, max)
}

// stateSource decodes the ID of a peer to fetch a state from and learns
// its gossiped addresses.
func (n *Node) stateSource(p string) (peer.ID, error) {
	id, err := peer.Decode(p)
	if err != nil {
		return "", fmt.Errorf("node: state source %q: %w", p, err)
	}
	n.learnAddrs(id)
	return id, nil
}

// ServeState serves the training state from src (nil stops serving).
func (n *Node) ServeState(src func(from string, step uint64) ([]byte, error)) {
	n.state.SetSource(src)
}

// ServeLayout serves this peer's layout description from src (nil stops
// serving): an external trainer's parameters, which a peer whose own differ
// fetches to name the difference.
func (n *Node) ServeLayout(src func(from string) ([]byte, error)) {
	n.state.SetLayoutSource(src)
}

// FetchLayout downloads peer p's layout description (statesync.FetchLayout).
func (n *Node) FetchLayout(ctx context.Context, p string) ([]byte, error) {
	id, err := n.stateSource(p)
	if err != nil {
		return nil, err
	}
	return statesync.FetchLayout(ctx, n.host, id)
}

// ServeStageState serves pipeline stages' states from src (nil stops serving).
func (n *Node) ServeStageState(src func(from string, step uint64, stage int) ([]byte, error)) {
	n.state.SetStageSource(src)
}

// Links returns this peer's latest measurements of its links to the other
// members, sorted by peer ID.
func (n *Node) Links() []probe.LinkStatus { return n.probe.Statuses() }

// LinkMatrix returns the measured throughput in bytes/s between the peers of
// order (plan.LinkMatrix) from this peer's own measurements and the figures
// the other members gossip.
func (n *Node) LinkMatrix(order []string) plan.Matrix {
	members, _ := n.gsp.Snapshot()
	rows := plan.LinkRows(members)
	self := n.host.ID().String()
	rows[self] = nil
	for _, l := range n.probe.Statuses() {
		rows[self] = append(rows[self], gossip.LinkFigure{Peer: l.Peer, MbitS: l.MbitS, RTTMs: l.RTTMs})
	}
	m, _ := plan.LinkMatrix(order, rows)
	return m
}

// probeTargets returns the live members this peer is connected to.
func (n *Node) probeTargets() []peer.ID {
	members, _ := n.gsp.Snapshot()
	var out []peer.ID
	for _, m := range members {
		id, err := peer.Decode(m.PeerID)
		if err != nil || id == n.host.ID() || m.State != gossip.Alive {
			continue
		}
		if n.host.Network().Connectedness(id) == network.Connected {
			out = append(out, id)
		}
	}
	return out
}

// InjectLink records a link measurement as if this peer had probed it, and
// sends a heartbeat so the members learn it (tests and benchmarks lay out
// known links with it).
func (n *Node) InjectLink(st probe.LinkStatus) {
	n.probe.Set(st)
	n.gsp.Beat()
}

// SetCompute announces the compute this peer measured: the model's
// forward and backward passes take perSample per sample on its devices
// (gossip.Heartbeat.ComputeUS). The ring planner leaves members far
// slower than the others idle where a pipeline layout leaves some idle.
func (n *Node) SetCompute(perSample time.Duration) {
	n.mu.Lock()
	n.computeUS = max(float64(perSample)/float64(time.Microsecond), 0)
	n.mu.Unlock()
	n.gsp.Beat()
}

// SetPipelineStages tells the ring planner the number of pipeline stages
// the cluster trains with (train.pipeline_stages = "auto" once chosen;
// below 2: none), so that the epochs it plans lay the pipelines on the
// fastest links (plan.PipelineOrder).
func (n *Node) SetPipelineStages(stages int) { n.stages.Store(int32(stages)) }
