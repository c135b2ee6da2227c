package gossip

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// WireVersion is the version of the gossip message format. Peers reject messages
// of any other version.
const WireVersion = 1

// MaxMessageSize bounds every gossip message in bytes.
const MaxMessageSize = 64 << 10

// Limits on message fields, checked by Validate.
const (
	maxAddrs     = 32
	maxMembers   = 1024
	maxStringLen = 256
	// MaxLinks bounds the link figures of one heartbeat.
	MaxLinks = 64
	// maxScheduleLen bounds an epoch's schedule name.
	maxScheduleLen = 32
	// maxSpecLen bounds a codec spec in an epoch.
	maxSpecLen = 64
	// sharesTolerance is how far an epoch's shares may sum from 1.
	sharesTolerance = 1e-6
)

// Message types.
const (
	TypeHeartbeat = "heartbeat"
	TypeLeave     = "leave"
	TypeEpoch     = "epoch"
)

// Errors returned by Decode and Validate.
var (
	ErrMalformed      = errors.New("gossip: malformed message")
	ErrForeignCluster = errors.New("gossip: message from another cluster")
	ErrVersion        = errors.New("gossip: incompatible wire version")
	ErrSender         = errors.New("gossip: message author does not match its peer ID")
)

// Envelope is one gossip message. Exactly one of the bodies is set, as Type says.
type Envelope struct {
	V         int        `json:"v"`
	Cluster   string     `json:"cluster"`
	Type      string     `json:"type"`
	Heartbeat *Heartbeat `json:"heartbeat,omitempty"`
	Leave     *Leave     `json:"leave,omitempty"`
	Epoch     *Epoch     `json:"epoch,omitempty"`
}

// Heartbeat is what every peer publishes each heartbeat interval.
type Heartbeat struct {
	PeerID  string   `json:"peer_id"`
	Name    string   `json:"name"`
	Addrs   []string `json:"addrs"`
	Version string   `json:"version"`
	Step    uint64   `json:"step"`
	// Seq increases with every heartbeat and departure of the sender, across
	// restarts (it is derived from the sender's clock), so stale messages are ignored.
	Seq uint64 `json:"seq"`
	// Epoch is the ring epoch the sender has adopted (Number 0: none yet).
	Epoch Epoch `json:"epoch"`
	// WantEpoch asks the coordinator for a new epoch numbered above it (a
	// failed round needs a fresh ring even when membership is unchanged).
	WantEpoch uint64 `json:"want_epoch,omitempty"`
	// Observer marks a member that never joins a ring epoch (a peer that
	// runs no training, such as a monitoring box): it is not put in a ring
	// and never coordinates.
	Observer bool `json:"observer,omitempty"`
	// App is the application's payload (the trainer's position in an epoch,
	// its parameter checks, its devices): opaque to gossip, which bounds only
	// its size (MaxAppBytes) and carries it to every member.
	App []byte `json:"app,omitempty"`
	// Links are the sender's latest measurements of its links to other
	// members (at most MaxLinks, one per peer).
	Links []LinkFigure `json:"links,omitempty"`
	// Excluded lists the members the sender excludes now by its own
	// judgement (View.Exclude), so that a majority's exclusion is everyone's
	// (View.Excluded).
	Excluded []string `json:"excluded,omitempty"`
	// ComputeUS is the sender's measured compute: microseconds per sample
	// of the model's forward and backward passes on its devices (0: not
	// measured). The planner leaves members far slower than the others
	// idle where a pipeline layout leaves some idle.
	ComputeUS float64 `json:"compute_us,omitempty"`
}

// LinkFigure is one measured link, from the heartbeat's sender to Peer.
type LinkFigure struct {
	Peer string `json:"peer"`
	// MbitS is the measured throughput in Mbit/s (10^6 bits per second).
	MbitS float64 `json:"mbit_s"`
	// RTTMs is the measured round-trip time in milliseconds.
	RTTMs float64 `json:"rtt_ms"`
}

// checkLinks validates a heartbeat's link figures.
func checkLinks(links []LinkFigure) error {
	if len(links) > MaxLinks {
		return fmt.Errorf("%w: %d links (max %d)", ErrMalformed, len(links), MaxLinks)
	}
	seen := make(map[string]bool, len(links))
	for _, l := range links {
		if err := checkString("link peer", l.Peer, true); err != nil {
			return err
		}
		if seen[l.Peer] {
			return fmt.Errorf("%w: link to %s listed twice", ErrMalformed, l.Peer)
		}
		seen[l.Peer] = true
		for _, v := range []float64{l.MbitS, l.RTTMs} {
			if !finiteNonNegative(v) {
				return fmt.Errorf("%w: link to %s has figure %v", ErrMalformed, l.Peer, v)
			}
		}
	}
	return nil
}

// checkCompute validates a heartbeat's compute figure.
func checkCompute(us float64) error {
	if !finiteNonNegative(us) {
		return fmt.Errorf("%w: compute figure %v µs per sample (want finite, ≥ 0)", ErrMalformed, us)
	}
	return nil
}

func finiteNonNegative(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }

// MaxAppBytes bounds a heartbeat's application payload.
const MaxAppBytes = 4096

func checkApp(app []byte) error {
	if len(app) > MaxAppBytes {
		return fmt.Errorf("%w: application payload of %d bytes (max %d)", ErrMalformed, len(app), MaxAppBytes)
	}
	return nil
}

// Leave announces a clean departure.
type Leave struct {
	PeerID string `json:"peer_id"`
	Seq    uint64 `json:"seq"`
}

// Epoch is one ring configuration.
type Epoch struct {
	Number      uint64   `json:"number"`
	Order       []string `json:"order"`
	StartStep   uint64   `json:"start_step"`
	Coordinator string   `json:"coordinator"`
	// Schedule, when set, is the all-reduce schedule every member uses in
	// this epoch (the coordinator's choice, a name such as "auto", "ring" or
	// "proportional"); empty leaves it to each member's configuration.
	Schedule string `json:"schedule,omitempty"`
	// Shares are the owner shares of the proportional schedule per rank
	// (Shares[k] belongs to Order[k]; non-negative, summing to 1); nil means
	// equal shares.
	Shares []float64 `json:"shares,omitempty"`
	// LinkCodecs, when set, are per-link codec specs of the ring schedule:
	// LinkCodecs[k] encodes the reduce-scatter hop from Order[k] to
	// Order[k+1] (wrapping). FinalCodec, set with them, encodes the
	// all-gather that every member decodes. Nil: the configured codec on
	// every link.
	LinkCodecs []string `json:"link_codecs,omitempty"`
	FinalCodec string   `json:"final_codec,omitempty"`
}

// Equal reports whether two epochs are the same configuration.
func (e Epoch) Equal(o Epoch) bool {
	return e.Number == o.Number && e.StartStep == o.StartStep && e.Coordinator == o.Coordinator &&
		slices.Equal(e.Order, o.Order) && e.Plan().Equal(o.Plan())
}

// Digest identifies the epoch by its content: two epochs with one number
// but different members, coordinators or layouts have different digests
// (the first 8 bytes of the SHA-256 of its JSON encoding, in hex).
func (e Epoch) Digest() string {
	b, _ := json.Marshal(e) // a struct of strings, numbers and slices: cannot fail
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Plan returns the epoch's layout.
func (e Epoch) Plan() EpochPlan {
	return EpochPlan{Order: e.Order, Schedule: e.Schedule, Shares: e.Shares, LinkCodecs: e.LinkCodecs, FinalCodec: e.FinalCodec}
}

// newer reports whether e should replace cur: a higher number, or the same number
// proposed by a lower peer ID.
func (e Epoch) newer(cur Epoch) bool {
	if e.Number != cur.Number {
		return e.Number > cur.Number
	}
	return e.Coordinator < cur.Coordinator
}

// validate checks an epoch's fields. The zero epoch (Number 0) is valid and empty.
func (e Epoch) validate() error {
	if e.Number == 0 {
		if len(e.Order) != 0 || e.Coordinator != "" || e.Schedule != "" || e.Shares != nil || e.LinkCodecs != nil || e.FinalCodec != "" {
			return fmt.Errorf("%w: epoch 0 must be empty", ErrMalformed)
		}
		return nil
	}
	if len(e.Order) == 0 || len(e.Order) > maxMembers {
		return fmt.Errorf("%w: epoch %d has %d members", ErrMalformed, e.Number, len(e.Order))
	}
	seen := make(map[string]bool, len(e.Order))
	hasCoord := false
	for _, p := range e.Order {
		if err := checkString("epoch member", p, true); err != nil {
			return err
		}
		if seen[p] {
			return fmt.Errorf("%w: epoch %d lists %s twice", ErrMalformed, e.Number, p)
		}
		seen[p] = true
		hasCoord = hasCoord || p == e.Coordinator
	}
	if !hasCoord {
		return fmt.Errorf("%w: epoch %d coordinator %q is not a member", ErrMalformed, e.Number, e.Coordinator)
	}
	return e.validatePlan()
}

// validatePlan checks an epoch's schedule and shares.
func (e Epoch) validatePlan() error {
	if len(e.Schedule) > maxScheduleLen || strings.ContainsFunc(e.Schedule, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' && r != '_'
	}) {
		return fmt.Errorf("%w: epoch %d schedule %q is not a short lower-case name", ErrMalformed, e.Number, e.Schedule)
	}
	if err := e.validateLinks(); err != nil {
		return err
	}
	if e.Shares == nil {
		return nil
	}
	if len(e.Shares) != len(e.Order) {
		return fmt.Errorf("%w: epoch %d has %d shares for %d members", ErrMalformed, e.Number, len(e.Shares), len(e.Order))
	}
	sum := 0.0
	for i, w := range e.Shares {
		if !finiteNonNegative(w) {
			return fmt.Errorf("%w: epoch %d share %d is %v", ErrMalformed, e.Number, i, w)
		}
		sum += w
	}
	if math.Abs(sum-1) > sharesTolerance {
		return fmt.Errorf("%w: epoch %d shares sum to %v, want 1", ErrMalformed, e.Number, sum)
	}
	return nil
}

// validateLinks checks an epoch's per-link codecs: one short spec per
// member and a final spec, or none of either. Whether the specs name codecs
// is the all-reduce's business.
func (e Epoch) validateLinks() error {
	if e.LinkCodecs == nil && e.FinalCodec == "" {
		return nil
	}
	if len(e.LinkCodecs) != len(e.Order) {
		return fmt.Errorf("%w: epoch %d has %d link codecs for %d members", ErrMalformed, e.Number, len(e.LinkCodecs), len(e.Order))
	}
	for i, s := range append([]string{e.FinalCodec}, e.LinkCodecs...) {
		if s == "" || len(s) > maxSpecLen || strings.ContainsFunc(s, func(r rune) bool {
			return (r < 'a' || r > 'z') && (r < '0' || r > '9') && !strings.ContainsRune(":=,.-_", r)
		}) {
			what := "final codec"
			if i > 0 {
				what = fmt.Sprintf("link codec %d", i-1)
			}
			return fmt.Errorf("%w: epoch %d %s %q is not a short codec spec", ErrMalformed, e.Number, what, s)
		}
	}
	return nil
}

func checkString(what, s string, required bool) error {
	switch {
	case required && s == "":
		return fmt.Errorf("%w: empty %s", ErrMalformed, what)
	case len(s) > maxStringLen:
		return fmt.Errorf("%w: %s longer than %d bytes", ErrMalformed, what, maxStringLen)
	case !utf8.ValidString(s) || strings.ContainsAny(s, "\x00\n\r"):
		return fmt.Errorf("%w: %s is not printable text", ErrMalformed, what)
	}
	return nil
}

func checkStrings(what string, ss []string, limit int) error {
	if len(ss) > limit {
		return fmt.Errorf("%w: %d %s (max %d)", ErrMalformed, len(ss), what, limit)
	}
	for _, s := range ss {
		if err := checkString(what, s, true); err != nil {
			return err
		}
	}
	return nil
}

// Encode marshals an envelope after validating it.
func Encode(e *Envelope) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("gossip: encode %s: %w", e.Type, err)
	}
	if len(b) > MaxMessageSize {
		return nil, fmt.Errorf("gossip: %s message is %d bytes (max %d)", e.Type, len(b), MaxMessageSize)
	}
	return b, nil
}

// Decode parses and validates a message for cluster, authored by author (the
// gossipsub-verified signer). Every failure wraps one of the package errors.
func Decode(data []byte, cluster, author string) (*Envelope, error) {
	if len(data) > MaxMessageSize {
		return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrMalformed, len(data), MaxMessageSize)
	}
	var e Envelope
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data", ErrMalformed)
	}
	if e.V != WireVersion {
		return nil, fmt.Errorf("%w: got %d, want %d", ErrVersion, e.V, WireVersion)
	}
	if e.Cluster != cluster {
		return nil, fmt.Errorf("%w: %q (this is %q)", ErrForeignCluster, e.Cluster, cluster)
	}
	if err := e.validate(author); err != nil {
		return nil, err
	}
	return &e, nil
}

func (e *Envelope) validate(author string) error {
	bodies := 0
	for _, set := range []bool{e.Heartbeat != nil, e.Leave != nil, e.Epoch != nil} {
		if set {
			bodies++
		}
	}
	if bodies != 1 {
		return fmt.Errorf("%w: %d bodies in a %q message", ErrMalformed, bodies, e.Type)
	}
	switch {
	case e.Type == TypeHeartbeat && e.Heartbeat != nil:
		h := e.Heartbeat
		if h.PeerID != author {
			return fmt.Errorf("%w: heartbeat for %s signed by %s", ErrSender, h.PeerID, author)
		}
		for _, err := range []error{
			checkString("name", h.Name, false),
			checkString("version", h.Version, true),
			checkStrings("addrs", h.Addrs, maxAddrs),
			checkApp(h.App),
			h.Epoch.validate(),
			checkLinks(h.Links),
			checkStrings("excluded members", h.Excluded, maxMembers),
			checkCompute(h.ComputeUS),
		} {
			if err != nil {
				return err
			}
		}
	case e.Type == TypeLeave && e.Leave != nil:
		if e.Leave.PeerID != author {
			return fmt.Errorf("%w: leave for %s signed by %s", ErrSender, e.Leave.PeerID, author)
		}
	case e.Type == TypeEpoch && e.Epoch != nil:
		if e.Epoch.Number == 0 {
			return fmt.Errorf("%w: proposal of epoch 0", ErrMalformed)
		}
		if e.Epoch.Coordinator != author {
			return fmt.Errorf("%w: epoch proposed by %s signed by %s", ErrSender, e.Epoch.Coordinator, author)
		}
		return e.Epoch.validate()
	default:
		return fmt.Errorf("%w: type %q does not match its body", ErrMalformed, e.Type)
	}
	return nil
}
