// Package gossip carries p2ptrain's control traffic over gossipsub: heartbeats,
// departures and ring epochs. It never carries tensors.
//
// The package is split in two:
//
//   - View (view.go) is a pure state machine, in the style of etcd's raft core:
//     it starts no goroutines, reads no clock and does no IO. Callers feed it
//     heartbeats, departures, epoch proposals and the current time, and read back
//     membership events and the epoch it wants proposed.
//   - Service (service.go) owns the gossipsub topic, the validators, the heartbeat
//     ticker and the goroutines that drive a View.
//
// Membership states: a member is alive while heartbeats arrive; suspect once it
// has been silent for SuspectAfter; dead once silent for the failure timeout;
// left when it announced its departure. Dead and left members are forgotten
// after ForgetAfter.
//
// Ring epochs: the coordinator is the alive (or suspect) member with the lowest
// peer ID. Whenever that set differs from the current epoch's members, the
// coordinator proposes a new epoch numbered one above every epoch it has seen.
// A Planner (Config.Planner; package node supplies one built on measured
// bandwidth) lays the epoch out: the ring order, and optionally the schedule
// and owner shares every member uses; without one the order is by peer ID.
// The Service runs the planner on a goroutine of its own, without the lock
// every message takes, and proposes its layout only if the view has not
// changed meanwhile (View.Draft, Draft.Plan, View.Complete).
// With Config.ReplanEvery the coordinator also proposes an epoch of unchanged
// members when the planner judges a new layout materially better, at most
// once per that interval. Heartbeats carry each member's link measurements
// (Heartbeat.Links), which is what the planner reads.
// Every member adopts the highest epoch it hears of (ties: the lower proposer);
// heartbeats repeat the sender's epoch, so a peer that missed a proposal, or a
// newcomer, catches up within one heartbeat.
package gossip
