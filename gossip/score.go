package gossip

import (
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Peer scoring (gossipsub v1.1) on the control topic. A peer that sends
// messages the validator rejects (malformed, wrong cluster, forged author)
// loses score quadratically in their number; below the thresholds its
// gossip is ignored, then it is not published to, then it is graylisted
// (everything it sends is dropped). Colocation is not penalised: clusters
// on one machine or behind one NAT share an address. Scores decay to zero
// within about a minute, so a peer that stops misbehaving recovers.
const (
	// invalidWeight is what the square of a peer's rejected messages costs.
	invalidWeight = -10
	// Thresholds: 4 rejected messages cross gossipThreshold, 8
	// publishThreshold, 11 graylistThreshold (less what has decayed).
	gossipThreshold   = -100
	publishThreshold  = -500
	graylistThreshold = -1000
	// scoreDecayTo is how long a counter takes to decay to 1% of itself.
	scoreDecayTo = time.Minute
)

// scoreParams returns the peer-score parameters and thresholds of a cluster's topic.
func scoreParams(topic string) (*pubsub.PeerScoreParams, *pubsub.PeerScoreThresholds) {
	decay := pubsub.ScoreParameterDecay(scoreDecayTo)
	params := &pubsub.PeerScoreParams{
		SkipAtomicValidation: true,
		Topics: map[string]*pubsub.TopicScoreParams{
			topic: {
				SkipAtomicValidation:           true,
				TopicWeight:                    1,
				TimeInMeshQuantum:              time.Second, // unused (weight 0) but divided by
				InvalidMessageDeliveriesWeight: invalidWeight,
				InvalidMessageDeliveriesDecay:  decay,
				FirstMessageDeliveriesWeight:   1,
				FirstMessageDeliveriesDecay:    decay,
				FirstMessageDeliveriesCap:      10,
			},
		},
		AppSpecificScore:          func(peer.ID) float64 { return 0 },
		BehaviourPenaltyWeight:    -1,
		BehaviourPenaltyThreshold: 6,
		BehaviourPenaltyDecay:     decay,
		DecayInterval:             time.Second,
		DecayToZero:               0.01,
		RetainScore:               10 * time.Minute,
	}
	thresholds := &pubsub.PeerScoreThresholds{
		GossipThreshold:             gossipThreshold,
		PublishThreshold:            publishThreshold,
		GraylistThreshold:           graylistThreshold,
		AcceptPXThreshold:           10,
		OpportunisticGraftThreshold: 1,
	}
	return params, thresholds
}
