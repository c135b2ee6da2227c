package node

import (
	"fmt"
	"time"

	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

// historyRecords bounds the records /history keeps: at one step record a
// second, over an hour of a run.
const historyRecords = 1 << 12

// Add implements telemetry.Sink: the node stamps the record with the time
// now if it has none, keeps it for /history and passes it to the sinks
// given to AddSink. The trainer sends its step, evaluation and event
// records here; the node adds the ring's events.
func (n *Node) Add(r telemetry.Record) {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	n.mu.Lock()
	if r.Kind == telemetry.KindEvent && r.Step == 0 {
		r.Step = n.step
	}
	sinks := n.sinks
	n.mu.Unlock()
	n.history.Add(r)
	sinks.Add(r)
}

// AddSink passes every later record to s as well (a metrics file, the
// Prometheus collector).
func (n *Node) AddSink(s telemetry.Sink) {
	n.mu.Lock()
	n.sinks = append(n.sinks[:len(n.sinks):len(n.sinks)], s)
	n.mu.Unlock()
}

// History returns the records made since seq (see telemetry.History.Since).
func (n *Node) History(seq uint64) ([]telemetry.Record, uint64) {
	return n.history.Since(seq)
}

// recordEvent turns a gossip view event into a telemetry record.
func (n *Node) recordEvent(ev gossip.Event) {
	switch {
	case ev.Epoch != nil:
		n.Add(telemetry.Record{Kind: telemetry.KindEvent, Event: telemetry.EventEpoch, Epoch: ev.Epoch.Number,
			Peers: len(ev.Epoch.Order), Peer: ev.Epoch.Coordinator,
			Message: fmt.Sprintf("ring epoch %d of %d members", ev.Epoch.Number, len(ev.Epoch.Order))})
	case ev.Member != nil:
		n.Add(telemetry.Record{Kind: telemetry.KindEvent, Event: telemetry.EventMember, Peer: ev.Member.Peer,
			Message: fmt.Sprintf("%s → %v", ev.Member.FromText(), ev.Member.To)})
	case ev.Exclusion != nil:
		n.Add(telemetry.Record{Kind: telemetry.KindEvent, Event: telemetry.EventExcluded, Peer: ev.Exclusion.Peer,
			Message: fmt.Sprintf("excluded for %s: %s", ev.Exclusion.For, ev.Exclusion.Reason)})
	}
}
