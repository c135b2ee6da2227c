// Package gossipsim holds, in its tests, a deterministic simulation of the
// control plane at scale: N gossip.Views, driven the way gossip.Service
// drives one, exchange heartbeats, departures and epoch proposals over a
// simulated network (seeded delays and drops) on a simulated clock, with
// the real planner (plan.Planner). It starts no libp2p host. The package
// has no code of its own outside its tests; see docs/failures.md ("The
// control plane at scale") for the figures and the command that
// regenerates them.
package gossipsim
