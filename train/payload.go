package train

import (
	"encoding/json"
	"fmt"

	"github.com/p2ptrain/p2ptrain/gossip"
)

// payloadVersion is the version of Payload this build writes and reads.
const payloadVersion = 1

// Payload is what the trainer adds to this peer's heartbeats (as the
// opaque gossip.Heartbeat.App): its position in the current ring epoch,
// its latest parameter check and its devices.
type Payload struct {
	// V is payloadVersion.
	V int `json:"v"`
	// Ready says the sender has stopped stepping in the epoch Ready names and
	// holds the state of Ready.Step completed steps: the members of an epoch
	// start training together from the highest such step.
	Ready *Ready `json:"ready,omitempty"`
	// Check is the sender's parameter hash after a given step.
	Check *ParamCheck `json:"check,omitempty"`
	// Devices are the sender's training devices.
	Devices []string `json:"devices,omitempty"`
	// Settings are the sender's training settings (Settings.cluster).
	Settings Settings `json:"settings,omitempty"`
	// Stages is the number of pipeline stages the sender trains with
	// under train.pipeline_stages = "auto" (nil: not chosen yet, or a
	// fixed number).
	Stages *StagesChoice `json:"stages,omitempty"`
}

// Ready is a member's training position at the start of an epoch. The
// epoch is identified by number and content (gossip.Epoch.Digest): two
// rings adopted under one number are different epochs.
type Ready struct {
	Epoch  uint64 `json:"epoch"`
	Digest string `json:"digest"`
	Step   uint64 `json:"step"`
	// Hash is the sender's parameter hash after Step steps: a peer that
	// fetches the state of that step accepts only the hash most of its
	// holders announced.
	Hash string `json:"hash,omitempty"`
	// Stage is the pipeline stage the sender's state is of (0 without
	// pipeline stages, train.pipeline_stages = 1).
	Stage int `json:"stage,omitempty"`
}

// In reports whether r was announced in epoch ep.
func (r *Ready) In(ep gossip.Epoch) bool {
	return r != nil && r.Epoch == ep.Number && r.Digest == ep.Digest()
}

// ParamCheck is a parameter hash after Step completed steps, of pipeline
// stage Stage (0 without pipeline stages).
type ParamCheck struct {
	Step  uint64 `json:"step"`
	Hash  string `json:"hash"`
	Stage int    `json:"stage,omitempty"`
}

// maxDevices and maxSettings bound the devices and settings a payload lists.
const (
	maxDevices  = 64
	maxSettings = 64
)

// Encode returns the payload as heartbeat bytes.
func (p Payload) Encode() []byte {
	p.V = payloadVersion
	b, _ := json.Marshal(p) // plain fields: cannot fail
	return b
}

// DecodePayload parses a member's heartbeat payload; an empty one is the
// zero Payload (a peer that does not train).
func DecodePayload(b []byte) (Payload, error) {
	var p Payload
	if len(b) == 0 {
		return p, nil
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return Payload{}, fmt.Errorf("train: heartbeat payload: %w", err)
	}
	if p.V != payloadVersion {
		return Payload{}, fmt.Errorf("train: heartbeat payload version %d (this build reads %d)", p.V, payloadVersion)
	}
	if len(p.Devices) > maxDevices {
		return Payload{}, fmt.Errorf("train: heartbeat payload lists %d devices (max %d)", len(p.Devices), maxDevices)
	}
	if len(p.Settings) > maxSettings {
		return Payload{}, fmt.Errorf("train: heartbeat payload lists %d settings (max %d)", len(p.Settings), maxSettings)
	}
	if p.Check != nil && (len(p.Check.Hash) == 0 || len(p.Check.Hash) > 128) {
		return Payload{}, fmt.Errorf("train: heartbeat payload: parameter hash of %d characters", len(p.Check.Hash))
	}
	if err := p.Stages.check(); err != nil {
		return Payload{}, fmt.Errorf("train: heartbeat payload: %w", err)
	}
	return p, nil
}

// payloadOf decodes member m's payload; a malformed one counts as empty.
func payloadOf(m gossip.Member) Payload {
	p, _ := DecodePayload(m.App)
	return p
}
