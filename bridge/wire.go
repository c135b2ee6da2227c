package bridge

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxMessage bounds one message's JSON body (a layout of many tensors is
// the largest).
const MaxMessage = 16 << 20

// ErrBadMessage: a message that is not a bounded, well-formed JSON object.
var ErrBadMessage = errors.New("bridge: bad message")

// writeMsg writes v as one message: a 4-byte little-endian length, then
// the JSON body.
func writeMsg(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("bridge: encoding a message: %w", err)
	}
	if len(body) > MaxMessage {
		return fmt.Errorf("%w: %d bytes (at most %d)", ErrBadMessage, len(body), MaxMessage)
	}
	b := make([]byte, 4, 4+len(body))
	binary.LittleEndian.PutUint32(b, uint32(len(body)))
	_, err = w.Write(append(b, body...))
	return err
}

// readMsg reads one message's body, checking its length before it
// allocates.
func readMsg(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size == 0 || size > MaxMessage {
		return nil, fmt.Errorf("%w: length %d (1 to %d)", ErrBadMessage, size, MaxMessage)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("%w: truncated body: %w", ErrBadMessage, err)
	}
	return body, nil
}

// decode unmarshals body into v (unknown fields are ignored, so a newer
// client can add some).
func decode(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w: %w", ErrBadMessage, err)
	}
	return nil
}

// envelope is the part every message to the daemon has.
type envelope struct {
	Op string `json:"op"`
}

// param is one tensor of the layout.
type param struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
	DType string `json:"dtype"`
}

// hello opens a connection (both roles).
type hello struct {
	Op       string            `json:"op"`
	Version  int               `json:"version"`
	Role     string            `json:"role"`
	PID      int               `json:"pid,omitempty"`
	Params   []param           `json:"params,omitempty"`
	Buckets  [][]int           `json:"buckets,omitempty"`
	Settings map[string]string `json:"settings,omitempty"`
	Step     uint64            `json:"step,omitempty"`
	Hash     string            `json:"hash,omitempty"`
	Session  string            `json:"session,omitempty"`
}

// helloReply answers a hello.
type helloReply struct {
	OK       bool   `json:"ok"`
	Kind     string `json:"kind,omitempty"`
	Error    string `json:"error,omitempty"`
	Version  int    `json:"version,omitempty"`
	Session  string `json:"session,omitempty"`
	SHM      string `json:"shm,omitempty"`
	SHMBytes int64  `json:"shm_bytes,omitempty"`
	Peer     string `json:"peer,omitempty"`
	Steps    uint64 `json:"steps,omitempty"`
}

// stepMsg is grad, wait, applied and restored: what the process says
// about a step on the main connection.
type stepMsg struct {
	Op     string   `json:"op"`
	Step   uint64   `json:"step"`
	Bucket *int     `json:"bucket,omitempty"`
	Loss   *float64 `json:"loss,omitempty"`
	Hash   string   `json:"hash,omitempty"`
}

// waitReply answers a wait.
type waitReply struct {
	Status      string `json:"status"`
	Step        uint64 `json:"step"`
	WantHash    bool   `json:"want_hash,omitempty"`
	Last        bool   `json:"last,omitempty"`
	Path        string `json:"path,omitempty"`
	ParamsBytes int64  `json:"params_bytes,omitempty"`
	ExtraBytes  int64  `json:"extra_bytes,omitempty"`
	Kind        string `json:"kind,omitempty"`
	Error       string `json:"error,omitempty"`
}

// callbackReq is what the daemon asks on the callback connection.
type callbackReq struct {
	Op   string `json:"op"`
	Step uint64 `json:"step"` // 0 too: a state at step 0 is asked for`
	Path string `json:"path,omitempty"`
	// After, when not 0, is the number of steps the process was told to
	// complete by an "averaged" answer it has not confirmed yet: it
	// answers once its update is done, not from the state before it.
	After uint64 `json:"after,omitempty"`
}

// callbackReply is the process's answer.
type callbackReply struct {
	OK          bool   `json:"ok"`
	Step        uint64 `json:"step"`
	Hash        string `json:"hash,omitempty"`
	ParamsBytes int64  `json:"params_bytes,omitempty"`
	ExtraBytes  int64  `json:"extra_bytes,omitempty"`
	Error       string `json:"error,omitempty"`
}
