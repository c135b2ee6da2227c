package pipeline

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// Kind says what a message carries and so which stage it goes to.
type Kind uint8

const (
	// Activation is a micro-batch's output, sent to the next stage.
	Activation Kind = iota + 1
	// Gradient is the gradient of a micro-batch's input, sent to the
	// previous stage.
	Gradient
	// Tied is a stage's part of the gradient of the weight the first and
	// the last stage share, sent to the other one of the two.
	Tied
	// Loss is the step's training loss, computed by the last stage, with
	// the pipeline's verdict on the step (Stage.Agree), passed back stage by
	// stage so that every stage reports the loss and decides alike.
	Loss
	// Commit is whether every stage up to the sender can apply the step,
	// passed forward stage by stage (Stage.Agree).
	Commit
	// EvalActivation is a chunk of the held-out set's activations, sent to
	// the next stage (Stage.Evaluate); Key.Micro is the chunk's index.
	EvalActivation
	// EvalStats is the held-out figures the last stage computed over the
	// chunks of an evaluation round so far, passed back stage by stage
	// (Stage.Evaluate); Key.Micro is the round's index.
	EvalStats
)

// LossBytes and CommitBytes are the payload sizes of Loss and Commit
// messages.
const (
	LossBytes   = 9
	CommitBytes = 1
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case Activation:
		return "activation"
	case Gradient:
		return "gradient"
	case Tied:
		return "tied"
	case Loss:
		return "loss"
	case Commit:
		return "commit"
	case EvalActivation:
		return "eval activation"
	case EvalStats:
		return "eval stats"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Key names one message of a pipeline. With the receiving stage it names
// the sender too: an Activation, a Commit and an EvalActivation come from
// the stage before, a Gradient, a Loss and an EvalStats from the stage
// after, Tied from the other end of the pipeline.
type Key struct {
	Step  uint64
	Micro int
	Kind  Kind
}

// String formats the key for errors.
func (k Key) String() string {
	switch k.Kind {
	case EvalActivation:
		return fmt.Sprintf("step %d chunk %d %v", k.Step, k.Micro, k.Kind)
	case EvalStats:
		return fmt.Sprintf("step %d round %d %v", k.Step, k.Micro, k.Kind)
	}
	return fmt.Sprintf("step %d micro-batch %d %v", k.Step, k.Micro, k.Kind)
}

// Transport carries one stage's messages in a pipeline of stages:
// Activation, Commit and EvalActivation messages to stage s+1, Gradient,
// Loss and EvalStats messages to stage s−1, Tied messages between stages 0 and S−1. Package
// protocol/pipestream implements it between peers; MemNetwork does in
// memory.
type Transport interface {
	// Send delivers payload as message k. It must not wait for the
	// receiver's Recv (a schedule's sends run ahead of the receives they
	// feed), and must not keep payload after it returns.
	Send(ctx context.Context, k Key, payload []byte) error
	// Recv returns the payload of message k sent to this stage, waiting
	// for it until ctx is done. The slice is the caller's.
	Recv(ctx context.Context, k Key) ([]byte, error)
}

// Kinds lists every message kind.
func Kinds() []Kind {
	return []Kind{Activation, Gradient, Tied, Loss, Commit, EvalActivation, EvalStats}
}

// forward reports whether messages of kind k go from stage s to s+1.
func (k Kind) forward() bool { return k == Activation || k == Commit || k == EvalActivation }

// backward reports whether messages of kind k go from stage s to s−1.
func (k Kind) backward() bool { return k == Gradient || k == Loss || k == EvalStats }

// Dest returns the stage a message of kind k from stage s of stages goes
// to, or an error when stage s sends no such message.
func Dest(k Kind, s, stages int) (int, error) { return dest(k, s, stages) }

// Source returns the stage a message of kind k to stage s of stages comes
// from, or an error when stage s receives no such message.
func Source(k Kind, s, stages int) (int, error) {
	switch {
	case k.forward() && s > 0 && s < stages:
		return s - 1, nil
	case k.backward() && s >= 0 && s+1 < stages:
		return s + 1, nil
	case k == Tied && stages > 1 && s == 0:
		return stages - 1, nil
	case k == Tied && stages > 1 && s == stages-1:
		return 0, nil
	}
	return 0, fmt.Errorf("pipeline: stage %d of %d receives no %v messages", s, stages, k)
}

// dest returns the stage a message of kind k from stage s of stages goes to.
func dest(k Kind, s, stages int) (int, error) {
	switch {
	case k.forward() && s >= 0 && s+1 < stages:
		return s + 1, nil
	case k.backward() && s > 0 && s < stages:
		return s - 1, nil
	case k == Tied && stages > 1 && s == 0:
		return stages - 1, nil
	case k == Tied && stages > 1 && s == stages-1:
		return 0, nil
	}
	return 0, fmt.Errorf("pipeline: stage %d of %d sends no %v messages", s, stages, k)
}

// MemNetwork connects the stages of one pipeline in memory (tests, and
// stages in one process). Each message is held until received; a message
// sent twice is an error.
type MemNetwork struct {
	stages int
	mu     sync.Mutex
	boxes  map[memAddr]chan []byte
}

type memAddr struct {
	to  int
	key Key
}

// NewMemNetwork returns a network of stages stages.
func NewMemNetwork(stages int) *MemNetwork {
	return &MemNetwork{stages: stages, boxes: map[memAddr]chan []byte{}}
}

// Stage returns stage s's Transport.
func (n *MemNetwork) Stage(s int) Transport { return memStage{n, s} }

// box returns the mailbox of a, making it if needed.
func (n *MemNetwork) box(a memAddr) chan []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.boxes[a]
	if !ok {
		b = make(chan []byte, 1)
		n.boxes[a] = b
	}
	return b
}

// Pending returns the number of messages sent and not yet received.
func (n *MemNetwork) Pending() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, b := range n.boxes {
		c += len(b)
	}
	return c
}

type memStage struct {
	n *MemNetwork
	s int
}

func (m memStage) Send(ctx context.Context, k Key, payload []byte) error {
	to, err := dest(k.Kind, m.s, m.n.stages)
	if err != nil {
		return err
	}
	select {
	case m.n.box(memAddr{to, k}) <- slices.Clone(payload):
		return nil
	default:
		return fmt.Errorf("pipeline: stage %d sent %v twice", m.s, k)
	}
}

func (m memStage) Recv(ctx context.Context, k Key) ([]byte, error) {
	a := memAddr{m.s, k}
	select {
	case p := <-m.n.box(a):
		m.n.mu.Lock()
		delete(m.n.boxes, a)
		m.n.mu.Unlock()
		return p, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("pipeline: stage %d waiting for %v: %w", m.s, k, context.Cause(ctx))
	}
}
