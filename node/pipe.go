package node

import "github.com/p2ptrain/p2ptrain/protocol/pipestream"

// OpenPipe returns the pipeline transport of this peer's stage in one
// pipeline of one ring epoch (protocol/pipestream): activations, their
// gradients, the loss and the tied table's gradient between stages. Close
// it when the epoch ends normally; Reset it after a failed step.
func (n *Node) OpenPipe(p pipestream.Pipe) (*pipestream.Transport, error) { return n.pipe.Open(p) }

// PipeSent returns the pipeline bytes this peer wrote, over every epoch.
func (n *Node) PipeSent() uint64 { return n.pipe.Sent() }
