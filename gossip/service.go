package gossip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
)

// Config configures a Service.
type Config struct {
	// Cluster namespaces the topic; peers of other clusters are rejected.
	Cluster string
	// Interval between heartbeats.
	Interval time.Duration
	// Timing of failure detection.
	Timing Timing
	// Self returns the local peer's current heartbeat fields (name, addresses,
	// version, step, devices). PeerID, Seq and Epoch are filled in by the Service.
	// It is called from the Service's goroutine and must not block.
	Self func() Heartbeat
	// Planner lays out the epochs this peer proposes as coordinator; nil
	// orders them by peer ID.
	Planner Planner
	// ReplanEvery is the least time between two epochs proposed for an
	// unchanged membership because the Planner found a materially better
	// layout (checked once per heartbeat interval); 0 re-plans only when
	// membership changes or a member asks for a new epoch.
	ReplanEvery time.Duration
}

// DefaultTiming derives failure-detection timing from a heartbeat interval and
// a failure timeout.
func DefaultTiming(interval, failAfter time.Duration) Timing {
	return Timing{
		SuspectAfter: min(2*interval+interval/2, failAfter),
		FailAfter:    failAfter,
		ForgetAfter:  max(12*failAfter, time.Minute),
	}
}

// minBeatDivisor spaces the extra heartbeats Beat asks for: at least
// Interval/minBeatDivisor apart, so a peer stepping fast does not flood
// the topic (and stays within the others' rate limits).
const minBeatDivisor = 8

// scoreInspectEvery is how often the Service reads gossipsub's peer scores.
const scoreInspectEvery = time.Second

// Topic returns the control topic of a cluster.
func Topic(cluster string) string { return "/p2ptrain/" + cluster + "/control/1" }

// Stats counts gossip traffic.
type Stats struct {
	// In counts accepted messages from other peers; Out counts published messages.
	In, Out uint64
	// Rejected counts messages the validator refused.
	Rejected uint64
	// RateLimited counts messages ignored because their author exceeded
	// its rate limit.
	RateLimited uint64
	// EpochsRejected counts epochs the view refused (View.Rejections).
	EpochsRejected uint64
	// Waiting says why this peer, as coordinator, proposes no epoch
	// although membership changed, or why it refuses its coordinator's
	// epoch for want of a quorum (View.Waiting); "" when nothing holds it.
	Waiting string
}

// Service publishes heartbeats, tracks membership and agrees on ring epochs.
type Service struct {
	cfg   Config
	self  peer.ID
	log   *zap.Logger
	ps    *pubsub.PubSub
	topic *pubsub.Topic
	sub   *pubsub.Subscription

	in, out, rejected, limited atomic.Uint64
	limit                      *limiter

	// scores are gossipsub's latest peer scores (scoreMu guards them).
	scoreMu sync.Mutex
	scores  map[peer.ID]float64

	mu   sync.Mutex
	view *View
	// loggedRejections and waiting are what the log last said of the
	// view's refusals and of why it proposes nothing.
	loggedRejections uint64
	waiting          string
	// lastProposal rate-limits proposals to one per heartbeat interval, so
	// views that disagree for a while cannot out-propose each other at message speed.
	lastProposal time.Time
	// lastBeat is when the run loop last published a heartbeat (its own).
	lastBeat time.Time
	seq      uint64
	subs     map[chan Event]struct{}
	closed   bool

	// beat asks the loop for an immediate heartbeat.
	beat chan struct{}
	// planned carries a proposal laid out by the planning goroutine back to
	// the run loop; planning (the run loop's alone) says one is under way.
	planned  chan *Draft
	planning bool
	// stop ends the heartbeat loop; cancel ends gossipsub itself.
	stop, cancel context.CancelFunc
	stopOnce     sync.Once
	wg           sync.WaitGroup
}

// New joins the cluster's control topic on h and starts heartbeating. Close stops it.
func New(ctx context.Context, h host.Host, cfg Config, log *zap.Logger) (*Service, error) {
	if cfg.Cluster == "" || cfg.Interval <= 0 || cfg.Timing.FailAfter <= 0 || cfg.Self == nil {
		return nil, errors.New("gossip: config needs a cluster, a positive interval and failure timeout, and Self")
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Service{cfg: cfg, self: h.ID(), log: log, cancel: cancel, subs: map[chan Event]struct{}{},
		limit: newLimiter(ratePerInterval, cfg.Interval, rateBurst)}
	name := Topic(cfg.Cluster)
	params, thresholds := scoreParams(name)
	ps, err := pubsub.NewGossipSub(ctx, h,
		pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
		pubsub.WithPeerScore(params, thresholds),
		pubsub.WithPeerScoreInspect(s.setScores, scoreInspectEvery),
		pubsub.WithMaxMessageSize(MaxMessageSize+4096),
		pubsub.WithLogger(slog.New(zapslog.NewHandler(log.Named("pubsub").Core()))),
	)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("gossip: start gossipsub: %w", err)
	}
	s.ps = ps
	if err := ps.RegisterTopicValidator(name, s.validate); err != nil {
		cancel()
		return nil, fmt.Errorf("gossip: register validator: %w", err)
	}
	if s.topic, err = ps.Join(name); err != nil {
		cancel()
		return nil, fmt.Errorf("gossip: join %s: %w", name, err)
	}
	if s.sub, err = s.topic.Subscribe(); err != nil {
		cancel()
		return nil, fmt.Errorf("gossip: subscribe %s: %w", name, err)
	}
	now := time.Now()
	s.view = NewView(s.selfHeartbeat(now), cfg.Timing, now)
	s.view.SetPlanner(cfg.Planner, cfg.ReplanEvery)

	s.beat = make(chan struct{}, 1)
	s.planned = make(chan *Draft, 1)
	msgs := make(chan *Envelope, 64)
	loopCtx, stop := context.WithCancel(ctx)
	s.stop = stop
	s.wg.Add(2)
	go s.read(loopCtx, msgs)
	go s.run(loopCtx, msgs)
	return s, nil
}

// nextSeq returns a sequence number above every earlier one, also across restarts.
// Callers hold s.mu.
func (s *Service) nextSeq(now time.Time) uint64 {
	s.seq = max(s.seq+1, uint64(now.UnixNano()))
	return s.seq
}

// selfHeartbeat builds the local heartbeat. Callers hold s.mu (or own s alone).
func (s *Service) selfHeartbeat(now time.Time) Heartbeat {
	hb := s.cfg.Self()
	hb.PeerID = s.self.String()
	hb.Seq = s.nextSeq(now)
	if s.view != nil {
		hb.Epoch = s.view.Epoch()
		hb.Excluded = s.view.OwnExclusions()
	}
	return hb
}

func (s *Service) validate(_ context.Context, _ peer.ID, msg *pubsub.Message) pubsub.ValidationResult {
	if from := msg.GetFrom(); from != s.self && !s.limit.allow(from, time.Now()) {
		if s.limited.Add(1)%100 == 1 {
			s.log.Warn("gossip rate limit: ignoring messages", zap.Stringer("from", from), zap.Uint64("ignored_total", s.limited.Load()))
		}
		return pubsub.ValidationIgnore
	}
	env, err := Decode(msg.GetData(), s.cfg.Cluster, msg.GetFrom().String())
	if err != nil {
		s.rejected.Add(1)
		s.log.Warn("rejected gossip message", zap.Stringer("from", msg.GetFrom()), zap.Error(err))
		return pubsub.ValidationReject
	}
	msg.ValidatorData = env
	return pubsub.ValidationAccept
}

// read moves validated messages from other peers to the run loop.
func (s *Service) read(ctx context.Context, msgs chan<- *Envelope) {
	defer s.wg.Done()
	for {
		m, err := s.sub.Next(ctx)
		if err != nil {
			return
		}
		if m.GetFrom() == s.self {
			continue
		}
		env, ok := m.ValidatorData.(*Envelope)
		if !ok {
			continue
		}
		s.in.Add(1)
		select {
		case msgs <- env:
		case <-ctx.Done():
			return
		}
	}
}

func (s *Service) run(ctx context.Context, msgs <-chan *Envelope) {
	defer s.wg.Done()
	// Stagger the first tick so a cluster started at once doesn't beat in lockstep;
	// the first heartbeat goes out immediately so peers learn of us fast.
	s.heartbeat(ctx)
	timer := time.NewTimer(rand.N(s.cfg.Interval) + 1)
	defer timer.Stop()
	// beatLater holds back a Beat that came too soon after the last
	// heartbeat (minBeatDivisor); beatDue is its channel while armed.
	beatLater := time.NewTimer(time.Hour)
	beatLater.Stop()
	defer beatLater.Stop()
	var beatDue <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case env := <-msgs:
			now := time.Now()
			s.mu.Lock()
			var evs []Event
			switch {
			case env.Heartbeat != nil:
				evs = s.view.Heartbeat(*env.Heartbeat, now)
			case env.Leave != nil:
				evs = s.view.Leave(*env.Leave, now)
			case env.Epoch != nil:
				evs = s.view.Offer(*env.Epoch, env.Epoch.Coordinator, now) // Decode checked that it signed the proposal
			}
			s.logRejection()
			s.mu.Unlock()
			s.emit(evs)
			s.propose(ctx, false)
		case <-s.beat:
			if wait := time.Until(s.lastBeat.Add(s.cfg.Interval / minBeatDivisor)); wait > 0 {
				if beatDue == nil {
					beatLater.Reset(wait)
					beatDue = beatLater.C
				}
				continue
			}
			s.heartbeat(ctx)
			s.propose(ctx, false)
		case <-beatDue:
			beatDue = nil
			s.heartbeat(ctx)
			s.propose(ctx, false)
		case d := <-s.planned:
			s.complete(ctx, d)
		case <-timer.C:
			timer.Reset(s.cfg.Interval)
			s.mu.Lock()
			evs := s.view.Tick(time.Now())
			s.mu.Unlock()
			s.emit(evs)
			s.propose(ctx, true)
			s.heartbeat(ctx)
		}
	}
}

// heartbeat publishes the local heartbeat; only the run loop calls it.
func (s *Service) heartbeat(ctx context.Context) {
	now := time.Now()
	s.lastBeat = now
	s.mu.Lock()
	hb := s.selfHeartbeat(now)
	s.view.UpdateSelf(hb, now)
	s.mu.Unlock()
	s.publish(ctx, &Envelope{Type: TypeHeartbeat, Heartbeat: &hb})
}

// propose starts laying out a new epoch if the local peer is the
// coordinator and the live membership changed or, with replan, the
// re-plan interval passed. Only the run loop calls it. The planner runs on
// a goroutine of its own without s.mu (it takes tens of milliseconds at
// hundreds of peers, and every gossip message, Commit and Snapshot need
// s.mu), and the run loop handles messages meanwhile; complete proposes
// the result. One layout is under way at a time.
func (s *Service) propose(ctx context.Context, replan bool) {
	if s.planning {
		return // the layout under way is proposed, or dropped, first
	}
	now := time.Now()
	s.mu.Lock()
	if now.Sub(s.lastProposal) < s.cfg.Interval {
		s.mu.Unlock()
		return // the next tick proposes, if still needed
	}
	d, ok := s.view.Draft(s.view.members[s.view.self].Step, now, replan)
	s.logWaiting()
	s.mu.Unlock()
	if !ok {
		return
	}
	s.planning = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		d.Plan()
		select {
		case s.planned <- d:
		case <-ctx.Done():
		}
	}()
}

// complete proposes the epoch of a laid-out draft if the view still calls
// for it (View.Complete) and publishes it. A stale layout is dropped: the
// next message or tick drafts again. Only the run loop calls it.
func (s *Service) complete(ctx context.Context, d *Draft) {
	s.planning = false
	now := time.Now()
	s.mu.Lock()
	e, ok := s.view.Complete(d, now)
	var evs []Event
	if ok {
		s.lastProposal = now
		evs = s.view.Offer(e, s.view.self, now)
	}
	s.logWaiting()
	s.mu.Unlock()
	if !ok {
		return // the next message or tick drafts again, if still needed
	}
	s.log.Info("proposing ring epoch", zap.Uint64("epoch", e.Number), zap.Strings("order", e.Order),
		zap.String("schedule", e.Schedule), zap.Float64s("shares", e.Shares))
	s.emit(evs)
	s.publish(ctx, &Envelope{Type: TypeEpoch, Epoch: &e})
}

// logWaiting logs when why the view proposes nothing changes. Callers hold s.mu.
func (s *Service) logWaiting() {
	if w := s.view.Waiting(); w != s.waiting {
		s.waiting = w
		if w != "" {
			s.log.Warn("not proposing a ring epoch", zap.String("reason", w))
		} else {
			s.log.Info("proposing ring epochs again")
		}
	}
}

func (s *Service) publish(ctx context.Context, env *Envelope) {
	env.V = WireVersion
	env.Cluster = s.cfg.Cluster
	b, err := Encode(env)
	if err == nil {
		err = s.topic.Publish(ctx, b)
	}
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("gossip publish failed", zap.String("type", env.Type), zap.Error(err))
		}
		return
	}
	s.out.Add(1)
}

func (s *Service) emit(evs []Event) {
	if len(evs) == 0 {
		return
	}
	for _, ev := range evs {
		switch {
		case ev.Member != nil:
			s.log.Info("member state", zap.String("peer", ev.Member.Peer),
				zap.String("from", ev.Member.FromText()), zap.Stringer("to", ev.Member.To))
		case ev.Epoch != nil:
			s.log.Info("adopted ring epoch", zap.Uint64("epoch", ev.Epoch.Number),
				zap.Strings("order", ev.Epoch.Order), zap.String("coordinator", ev.Epoch.Coordinator))
		case ev.Exclusion != nil:
			s.log.Warn("excluding a member from ring epochs", zap.String("peer", ev.Exclusion.Peer),
				zap.Duration("for", ev.Exclusion.For), zap.String("reason", ev.Exclusion.Reason))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.subs {
		for _, ev := range evs {
			select {
			case ch <- ev:
			default:
				s.log.Warn("gossip event subscriber is full; dropping event")
			}
		}
	}
}

// Beat publishes a heartbeat now (after the Self fields changed in a way
// others should learn at once) and re-evaluates whether to propose an epoch.
func (s *Service) Beat() {
	select {
	case s.beat <- struct{}{}:
	default:
	}
}

// Subscribe returns a channel of view events and a function that cancels the
// subscription. Events are dropped (and logged) if the reader falls more than
// 256 events behind; readers that must not miss state should also poll Snapshot.
func (s *Service) Subscribe() (<-chan Event, func()) {
	ch := make(chan Event, 256)
	s.mu.Lock()
	if !s.closed {
		s.subs[ch] = struct{}{}
	} else {
		close(ch)
	}
	s.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			s.mu.Lock()
			if _, ok := s.subs[ch]; ok {
				delete(s.subs, ch)
				close(ch)
			}
			s.mu.Unlock()
		})
	}
}

// Exclude keeps peer out of the ring epochs this peer proposes, and out
// of the coordinator's seat in its view, for a back-off (View.Exclude): the
// trainer calls it for a member blamed for consecutive failed steps. It
// logs the exclusion and re-evaluates the proposal at once.
func (s *Service) Exclude(peer, reason string) {
	now := time.Now()
	s.mu.Lock()
	d := s.view.Exclude(peer, reason, now)
	s.mu.Unlock()
	if d == 0 {
		return
	}
	s.emit([]Event{{Exclusion: &ExclusionChange{Peer: peer, For: d, Reason: reason}}}) // logged there
	s.Beat()
}

// Commit records that the local peer completed a step in ring epoch
// number (View.Commit): later proposals need a majority of that ring.
func (s *Service) Commit(number uint64) {
	s.mu.Lock()
	s.view.Commit(number)
	s.mu.Unlock()
}

// Snapshot returns the members (sorted by peer ID) and the adopted epoch.
func (s *Service) Snapshot() ([]Member, Epoch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.view.Members(), cloneEpoch(s.view.Epoch())
}

// Stats returns traffic counters and the view's epoch rejections.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	n, _ := s.view.Rejections()
	w := s.view.Waiting()
	s.mu.Unlock()
	return Stats{In: s.in.Load(), Out: s.out.Load(), Rejected: s.rejected.Load(), RateLimited: s.limited.Load(),
		EpochsRejected: n, Waiting: w}
}

// setScores records gossipsub's peer scores (its inspection callback).
func (s *Service) setScores(scores map[peer.ID]float64) {
	s.scoreMu.Lock()
	s.scores = scores
	s.scoreMu.Unlock()
}

// Score returns gossipsub's latest score of peer p (0 when it has none): a
// peer that sends messages the validator rejects goes negative, and below
// -1000 everything it sends is dropped.
func (s *Service) Score(p string) float64 {
	id, err := peer.Decode(p)
	if err != nil {
		return 0
	}
	s.scoreMu.Lock()
	defer s.scoreMu.Unlock()
	return s.scores[id]
}

// logRejection logs an epoch the view refused since the last call. Callers
// hold s.mu.
func (s *Service) logRejection() {
	n, err := s.view.Rejections()
	if n != s.loggedRejections {
		s.loggedRejections = n
		s.log.Warn("refused a ring epoch", zap.Uint64("refused_total", n), zap.Error(err))
	}
}

// stopLoop stops heartbeating and reading; idempotent.
func (s *Service) stopLoop() {
	s.stopOnce.Do(func() {
		s.stop()
		s.wg.Wait()
	})
}

// Leave stops heartbeating and announces the local peer's departure so others
// re-form the ring at once. Call Close afterwards.
func (s *Service) Leave(ctx context.Context) error {
	s.stopLoop()
	s.mu.Lock()
	l := Leave{PeerID: s.self.String(), Seq: s.nextSeq(time.Now())}
	s.mu.Unlock()
	env := &Envelope{V: WireVersion, Cluster: s.cfg.Cluster, Type: TypeLeave, Leave: &l}
	b, err := Encode(env)
	if err != nil {
		return err
	}
	if err := s.topic.Publish(ctx, b); err != nil {
		return fmt.Errorf("gossip: announce departure: %w", err)
	}
	s.out.Add(1)
	return nil
}

// Close stops heartbeating and leaves the topic. It is idempotent.
func (s *Service) Close() error {
	s.stopLoop()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for ch := range s.subs {
		delete(s.subs, ch)
		close(ch)
	}
	s.mu.Unlock()
	s.sub.Cancel()
	err := s.topic.Close()
	s.cancel()
	return err
}
