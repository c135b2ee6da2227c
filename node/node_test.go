package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/p2ptrain/p2ptrain/config"
	"github.com/p2ptrain/p2ptrain/gossip"
	"github.com/p2ptrain/p2ptrain/node/nodetest"
	"github.com/p2ptrain/p2ptrain/telemetry"
)

const (
	testHeartbeat = nodetest.Heartbeat
	testFailAfter = nodetest.FailAfter
)

// testConfig is a loopback-only peer with fast failure detection and no mDNS.
func testConfig(bootstrap ...string) config.Config { return nodetest.Config(bootstrap...) }

func startNode(t *testing.T, cfg config.Config, log *zap.Logger) *Node {
	t.Helper()
	if log == nil {
		log = nodetest.Logger(t, cfg)
	}
	n, err := New(context.Background(), cfg, log)
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() { n.Kill() })
	return n
}

// eventually polls cond until it returns nil or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	return nodetest.Eventually(t, within, what, cond)
}

// agreeOn checks that every node lists exactly the given peers as alive and
// has adopted one identical epoch whose order is those peers.
func agreeOn(nodes []*Node, want []peer.ID) error {
	var ids []string
	for _, p := range want {
		ids = append(ids, p.String())
	}
	slices.Sort(ids)
	var first *gossip.Epoch
	for _, n := range nodes {
		members, epoch := n.Gossip().Snapshot()
		var alive []string
		for _, m := range members {
			if m.State == gossip.Alive {
				alive = append(alive, m.PeerID)
			}
		}
		if !slices.Equal(alive, ids) {
			return fmt.Errorf("%s sees alive %d members, want %d", n.ID(), len(alive), len(ids))
		}
		order := slices.Clone(epoch.Order)
		slices.Sort(order)
		if !slices.Equal(order, ids) {
			return fmt.Errorf("%s has epoch %d with %d members, want %d", n.ID(), epoch.Number, len(epoch.Order), len(ids))
		}
		if first == nil {
			first = &epoch
		} else if !first.Equal(epoch) {
			return fmt.Errorf("epochs differ: %d vs %d", first.Number, epoch.Number)
		}
	}
	return nil
}

func ids(nodes []*Node) []peer.ID {
	var out []peer.ID
	for _, n := range nodes {
		out = append(out, n.ID())
	}
	return out
}

func stateOn(n *Node, p peer.ID) gossip.State {
	members, _ := n.Gossip().Snapshot()
	for _, m := range members {
		if m.PeerID == p.String() {
			return m.State
		}
	}
	return -1
}

func TestClusterLifecycle(t *testing.T) {
	first := startNode(t, testConfig(), nil)
	boot := first.AddrStrings()[0]
	nodes := []*Node{first}
	for i := 0; i < 4; i++ {
		nodes = append(nodes, startNode(t, testConfig(boot), nil))
	}
	took := eventually(t, 15*time.Second, "5 peers agree", func() error { return agreeOn(nodes, ids(nodes)) })
	t.Logf("5 peers agreed on one epoch after %s", took)

	// A clean departure: the others re-form at once, from the announcement.
	leaver := nodes[2]
	if err := leaver.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	nodes = slices.Delete(nodes, 2, 3)
	took = eventually(t, 10*time.Second, "4 peers agree after a clean leave", func() error { return agreeOn(nodes, ids(nodes)) })
	for _, n := range nodes {
		if st := stateOn(n, leaver.ID()); st != gossip.Left {
			t.Fatalf("%s sees the departed peer as %v, want left (the departure announcement was not used)", n.ID(), st)
		}
	}
	t.Logf("clean leave: 4 peers agreed after %s (failure timeout %s)", took, testFailAfter)

	// A crash: detected by the failure timeout.
	victim := nodes[0] // the bootstrap peer
	killed := time.Now()
	if err := victim.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	nodes = nodes[1:]
	// The issue asks for failure timeout + two heartbeats; allow one more second
	// of slack for a loaded CI machine and log the figure.
	took = eventually(t, testFailAfter+2*testHeartbeat+time.Second, "3 peers agree after a crash",
		func() error { return agreeOn(nodes, ids(nodes)) })
	t.Logf("crash: 3 peers agreed %s after the kill (failure timeout %s + 2 heartbeats = %s)",
		time.Since(killed), testFailAfter, testFailAfter+2*testHeartbeat)
	eventually(t, testFailAfter, "every view marks the crashed peer dead", func() error {
		for _, n := range nodes {
			if st := stateOn(n, victim.ID()); st != gossip.Dead {
				return fmt.Errorf("%s sees it as %v", n.ID(), st)
			}
		}
		return nil
	})

	// Newcomers bootstrapping to different members still find everyone (peer exchange).
	nodes = append(nodes,
		startNode(t, testConfig(nodes[0].AddrStrings()[0]), nil),
		startNode(t, testConfig(nodes[1].AddrStrings()[0]), nil))
	took = eventually(t, 15*time.Second, "5 peers agree after two joins", func() error { return agreeOn(nodes, ids(nodes)) })
	t.Logf("joins: 5 peers agreed after %s", took)
}

func TestWrongSwarmKeyCannotJoin(t *testing.T) {
	keys := swarmKeys(t, 2)
	keyA, keyB := keys[0], keys[1]
	cfg := testConfig()
	cfg.Node.SwarmKey = keyA
	a := startNode(t, cfg, nil)
	cfg = testConfig(a.AddrStrings()[0])
	cfg.Node.SwarmKey = keyA
	b := startNode(t, cfg, nil)

	core, logs := observer.New(zapcore.WarnLevel)
	cfg = testConfig(a.AddrStrings()[0])
	cfg.Node.SwarmKey = keyB
	outsider := startNode(t, cfg, zap.New(core))

	eventually(t, 15*time.Second, "outsider retried its bootstrap twice", func() error {
		if c := logs.FilterMessage("bootstrap peer unreachable; retrying").Len(); c < 2 {
			return fmt.Errorf("%d failed attempts logged", c)
		}
		return nil
	})
	eventually(t, 15*time.Second, "the key holders agree", func() error {
		return agreeOn([]*Node{a, b}, []peer.ID{a.ID(), b.ID()})
	})
	for _, n := range []*Node{a, b} {
		if st := stateOn(n, outsider.ID()); st != -1 {
			t.Fatalf("peer with the wrong key appears as %v", st)
		}
	}
	if len(outsider.Host().Network().Peers()) != 0 {
		t.Fatalf("peer with the wrong key holds connections: %v", outsider.Host().Network().Peers())
	}
}

func TestUnreachableBootstrapKeepsRetrying(t *testing.T) {
	// A peer that existed once: its address is now closed.
	gone := startNode(t, testConfig(), nil)
	addr := gone.AddrStrings()[0]
	gone.Kill()
	core, logs := observer.New(zapcore.WarnLevel)
	startNode(t, testConfig(addr), zap.New(core))
	eventually(t, 15*time.Second, "three logged retries", func() error {
		entries := logs.FilterMessage("bootstrap peer unreachable; retrying").All()
		if len(entries) < 3 {
			return fmt.Errorf("%d retries logged", len(entries))
		}
		d0 := entries[0].ContextMap()["retry_in"].(time.Duration)
		d2 := entries[2].ContextMap()["retry_in"].(time.Duration)
		if d2 <= d0 {
			return fmt.Errorf("no backoff: %s then %s", d0, d2)
		}
		return nil
	})
}

func TestMalformedAndForeignGossipRejected(t *testing.T) {
	n := startNode(t, testConfig(), nil)
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps, err := pubsub.NewGossipSub(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join(gossip.Topic("test"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Connect(ctx, peer.AddrInfo{ID: n.ID(), Addrs: n.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	foreign, _ := gossip.Encode(&gossip.Envelope{V: gossip.WireVersion, Cluster: "other", Type: gossip.TypeHeartbeat,
		Heartbeat: &gossip.Heartbeat{PeerID: h.ID().String(), Version: "x"}})
	forged, _ := gossip.Encode(&gossip.Envelope{V: gossip.WireVersion, Cluster: "test", Type: gossip.TypeHeartbeat,
		Heartbeat: &gossip.Heartbeat{PeerID: n.ID().String(), Version: "x"}})
	future, _ := gossip.Encode(&gossip.Envelope{V: gossip.WireVersion + 1, Cluster: "test", Type: gossip.TypeLeave,
		Leave: &gossip.Leave{PeerID: h.ID().String()}})
	bad := [][]byte{[]byte("garbage"), foreign, forged, future}
	eventually(t, 10*time.Second, "all bad messages rejected", func() error {
		for _, m := range bad {
			// Publishing may race the subscription handshake; repeat until counted.
			_ = topic.Publish(ctx, m)
		}
		if r := n.Gossip().Stats().Rejected; r < uint64(len(bad)) {
			return fmt.Errorf("%d rejected", r)
		}
		return nil
	})
	if st := stateOn(n, h.ID()); st != -1 {
		t.Fatalf("sender of bad messages became a member (%v)", st)
	}
}

func TestAPI(t *testing.T) {
	cfg := testConfig()
	cfg.Node.API = "127.0.0.1:0"
	cfg.Node.Name = "api-test"
	n := startNode(t, cfg, nil)
	var st Status
	eventually(t, 10*time.Second, "status shows an epoch", func() error {
		body, err := get("http://" + n.APIAddr() + "/status")
		if err != nil {
			return err
		}
		if err := json.Unmarshal(body, &st); err != nil {
			return err
		}
		if st.Ring.Epoch == 0 {
			return errors.New("no epoch yet")
		}
		return nil
	})
	if st.PeerID != n.ID().String() || st.Name != "api-test" || st.Cluster != "test" || st.Version != Version ||
		len(st.Addrs) == 0 || len(st.Members) != 1 || st.Members[0].State != "alive" ||
		st.Ring.Coordinator != st.PeerID || !slices.Equal(st.Ring.Order, []string{st.PeerID}) {
		t.Fatalf("unexpected status %+v", st)
	}
	body, err := get("http://" + n.APIAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"p2ptrain_alive_peers 1", "p2ptrain_ring_epoch ", `p2ptrain_gossip_messages_total{direction="out"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestAPIRefusesRequestsForOtherNames: a page whose name resolves to this
// machine (DNS rebinding) gets 421 and nothing else; requests for an
// address, localhost or the machine's name are answered.
func TestAPIRefusesRequestsForOtherNames(t *testing.T) {
	h := rebindGuard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "status") }), "Lab-7")
	for host, want := range map[string]int{
		"127.0.0.1:7420": http.StatusOK, "[::1]:7420": http.StatusOK, "10.0.0.5": http.StatusOK,
		"localhost:7420": http.StatusOK, "LOCALHOST.": http.StatusOK, "grafana.localhost:7420": http.StatusOK,
		"lab-7:7420":            http.StatusOK,
		"attacker.example:7420": http.StatusMisdirectedRequest, "attacker.example": http.StatusMisdirectedRequest,
		"localhost.attacker.example": http.StatusMisdirectedRequest, "": http.StatusOK, // HTTP/1.0: no browser
	} {
		r := httptest.NewRequest("GET", "/status", nil)
		r.Host = host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != want {
			t.Errorf("Host %q: %d, want %d", host, rec.Code, want)
		}
		if want != http.StatusOK && (rec.Body.String() == "status" || !strings.Contains(rec.Body.String(), "DNS rebinding")) {
			t.Errorf("Host %q: body %q", host, rec.Body.String())
		}
	}
	// With node.api_public the operator opened the API to the network: any name.
	rec := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/status", nil)
	r.Host = "p2ptrain-7.lab.example.org:7420"
	apiHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "status") }), true).ServeHTTP(rec, r)
	if rec.Code != http.StatusOK {
		t.Errorf("api_public, Host %q: %d", r.Host, rec.Code)
	}
}

func get(url string) ([]byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

func TestAPIHistoryHasTheRingsEventsAndTheTrainersRecords(t *testing.T) {
	cfg := testConfig()
	cfg.Node.API = "127.0.0.1:0"
	n := startNode(t, cfg, nil)
	var sunk []telemetry.Record
	var mu sync.Mutex
	n.AddSink(sinkFunc(func(r telemetry.Record) {
		mu.Lock()
		sunk = append(sunk, r)
		mu.Unlock()
	}))
	type doc struct {
		Records []telemetry.Record `json:"records"`
		Last    uint64             `json:"last"`
	}
	read := func(url string) (doc, error) {
		var d doc
		body, err := get(url)
		if err == nil {
			err = json.Unmarshal(body, &d)
		}
		return d, err
	}
	var d doc
	eventually(t, 10*time.Second, "history shows the first epoch", func() (err error) {
		if d, err = read("http://" + n.APIAddr() + "/history"); err != nil {
			return err
		}
		for _, r := range d.Records {
			if r.Event == telemetry.EventEpoch && r.Peer == n.ID().String() && r.Peers == 1 {
				return nil
			}
		}
		return fmt.Errorf("no epoch event in %+v", d.Records)
	})
	n.Add(telemetry.Record{Kind: telemetry.KindStep, Step: 1, Loss: 2.5})
	d2, err := read(fmt.Sprintf("http://%s/history?since=%d", n.APIAddr(), d.Last))
	if err != nil {
		t.Fatal(err)
	}
	if len(d2.Records) == 0 || d2.Records[len(d2.Records)-1].Loss != 2.5 || d2.Records[0].Seq != d.Last+1 {
		t.Fatalf("history since %d = %+v; want the newer records, ending with the step", d.Last, d2)
	}
	mu.Lock()
	if len(sunk) == 0 || sunk[len(sunk)-1].Loss != 2.5 {
		t.Errorf("the added sink did not get the step record: %+v", sunk)
	}
	mu.Unlock()
	if _, err := get("http://" + n.APIAddr() + "/history?since=x"); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("a bad since: %v, want 400 Bad Request", err)
	}
}

type sinkFunc func(telemetry.Record)

func (f sinkFunc) Add(r telemetry.Record) { f(r) }
