package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/web"
)

// requireChromium returns the path of Debian's chromium. The page's test is
// part of the suite and scripts/setup.sh installs chromium, so a missing
// browser fails the test, unless P2PTRAIN_SKIP_BROWSER=1 asks to skip it.
func requireChromium(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process suite: skipped with -short")
	}
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("P2PTRAIN_SKIP_BROWSER") == "1" {
			t.Skip("chromium is not installed and P2PTRAIN_SKIP_BROWSER=1: the page's browser test is skipped")
		}
		t.Fatalf("chromium is not installed (run scripts/setup.sh: it installs Debian's chromium; "+
			"set P2PTRAIN_SKIP_BROWSER=1 to skip this test): %v", err)
	}
	return path
}

// chromium runs headless chromium with args and returns its stdout. Each
// run gets its own profile directory, so runs never share state.
func chromium(t *testing.T, browser string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
		"--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, browser, append(base, args...)...)
	cmd.WaitDelay = 5 * time.Second // its helper processes may hold stdout a little longer
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("chromium %v: %w\n%s", args, err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

var (
	startTag   = regexp.MustCompile(`<[a-z]+\b[^>]*>`)
	attrValues = regexp.MustCompile(`\b([a-z-]+)="([^"]*)"`)
)

// elements returns the attributes of every start tag of dom that has the
// attribute name, in document order.
func elements(dom []byte, name string) []map[string]string {
	var out []map[string]string
	for _, tag := range startTag.FindAll(dom, -1) {
		attrs := map[string]string{}
		for _, m := range attrValues.FindAllSubmatch(tag, -1) {
			attrs[string(m[1])] = string(m[2])
		}
		if _, ok := attrs[name]; ok {
			out = append(out, attrs)
		}
	}
	return out
}

// byID returns the attributes of dom's elements by their id.
func byID(dom []byte) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, el := range elements(dom, "id") {
		out[el["id"]] = el
	}
	return out
}

var ringNode = regexp.MustCompile(`(^|\s)ring-node(\s|$)`)

// pageSeries are the chart series the page must draw points for: training
// loss, test accuracy, samples/s, step time (its compute area) and bytes
// per step.
var pageSeries = []string{"series-loss", "series-eval", "series-rate", "series-compute", "series-bytes"}

// checkPage reports what the page's DOM still lacks: points in each of
// pageSeries, and a ring node for each of peers.
func checkPage(dom []byte, peers []string) error {
	ids := byID(dom)
	for _, id := range pageSeries {
		el, ok := ids[id]
		if !ok {
			return fmt.Errorf("no element #%s in the page", id)
		}
		if n, err := strconv.Atoi(el["data-points"]); err != nil || n <= 0 {
			return fmt.Errorf("#%s has data-points=%q, want a positive count", id, el["data-points"])
		}
	}
	// The members table's rows carry data-peer too: the ring's nodes are
	// the elements of class ring-node.
	inRing := map[string]bool{}
	for _, el := range elements(dom, "data-peer") {
		if ringNode.MatchString(el["class"]) {
			inRing[el["data-peer"]] = true
		}
	}
	for _, p := range peers {
		if !inRing[p] {
			return fmt.Errorf("the ring shows no node for peer %s (it shows %d nodes)", p, len(inRing))
		}
	}
	return nil
}

// evalCount returns the number of evaluation records in api's /history.
func evalCount(api string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+api+"/history", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var doc struct {
		Records []struct {
			Kind string `json:"kind"`
		} `json:"records"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return 0, fmt.Errorf("/history: %w", err)
	}
	n := 0
	for _, r := range doc.Records {
		if r.Kind == "eval" {
			n++
		}
	}
	return n, nil
}

// TestLivePageDrawsChartsAndBothRingPeers runs two training peers, loads
// the first one's live page (GET /) in headless chromium, and checks that
// the loss, test accuracy, samples/s, step time and bytes charts have
// points and that the ring shows both peers; a screenshot of the page is
// kept in the test's temporary directory (its path is logged). It needs
// chromium (scripts/setup.sh installs it) and fails without it, unless
// P2PTRAIN_SKIP_BROWSER=1 is set: then it is skipped.
func TestLivePageDrawsChartsAndBothRingPeers(t *testing.T) {
	browser := requireChromium(t)
	// A small model that trains for longer than the test runs, evaluated often.
	const cfg = "[train]\nsteps = 1000000\nhidden = [32]\nbatch_size = 16\ntrain_samples = 2048\neval_samples = 200\neval_every = 20\n"
	train := []string{"--min-peers", "2", "--codec", "sint8", "--model", "mlp"}
	first := startPeerConfig(t, cfg, append([]string{"--name", "page0"}, train...)...)
	second := startPeerConfig(t, cfg, append([]string{"--name", "page1", "--bootstrap", first.addr}, train...)...)
	peers := []*proc{first, second}
	eventually(t, 20*time.Second, "both peers show one ring of 2", func() error { return sameRing(peers, 2) })
	var ids []string
	for _, p := range peers {
		st, err := getStatus(p.api)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, st.PeerID)
	}
	eventually(t, time.Minute, "two evaluations in the first peer's history", func() error {
		n, err := evalCount(first.api)
		if err == nil && n < 2 {
			err = fmt.Errorf("%d evaluations", n)
		}
		return err
	})

	// The page polls once a second; the virtual time budget lets it fetch
	// and draw before chromium prints the DOM.
	url := "http://" + first.api + "/"
	var dom []byte
	eventually(t, 2*time.Minute, "the page shows points in every chart and both peers in the ring", func() error {
		var err error
		if dom, err = chromium(t, browser, "--virtual-time-budget=3000", "--dump-dom", url); err != nil {
			return err
		}
		return checkPage(dom, ids)
	})
	els := byID(dom)
	for _, id := range pageSeries {
		t.Logf("#%s: %s points", id, els[id]["data-points"])
	}

	shot := filepath.Join(t.TempDir(), "page.png")
	if _, err := chromium(t, browser, "--virtual-time-budget=3000", "--window-size=1400,1000", "--screenshot="+shot, url); err != nil {
		t.Fatal(err)
	}
	png, err := os.ReadFile(shot)
	if err != nil {
		t.Fatalf("chromium wrote no screenshot: %v", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("%s is not a PNG (%d bytes)", shot, len(png))
	}
	t.Logf("screenshot of the live page (%d bytes): %s", len(png), shot)
}

// fakeAPI serves the live page with a fixed /status and a /history that
// hands out records once (later calls, with since, get none).
func fakeAPI(t *testing.T, status any, records []map[string]any) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", web.Handler())
	mux.Handle("GET "+web.AssetPrefix, web.Handler())
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(status)
	})
	mux.HandleFunc("GET /history", func(w http.ResponseWriter, r *http.Request) {
		recs := records
		if r.URL.Query().Get("since") != "0" {
			recs = []map[string]any{}
		}
		json.NewEncoder(w).Encode(map[string]any{"records": recs, "last": len(records)})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/"
}

// attrInt returns the integer attribute name of the element with id, or
// fails the test.
func attrInt(t *testing.T, els map[string]map[string]string, id, name string) int {
	t.Helper()
	el, ok := els[id]
	if !ok {
		t.Fatalf("no element #%s in the page", id)
	}
	n, err := strconv.Atoi(el[name])
	if err != nil {
		t.Fatalf("#%s: %s=%q: %v", id, name, el[name], err)
	}
	return n
}

// TestLivePageCopesWithEmptyAndLargeHistories loads the page in headless
// chromium against a fake API: with no records and no ring every chart
// shows no points, and a page opened on a history of 4000 step records
// (some without a loss) and bits-per-byte evaluations (the gpt's) draws
// every finite point, decimated to a few per pixel, and the ring's three
// members with their links' codecs. Like the test above it needs chromium
// unless P2PTRAIN_SKIP_BROWSER=1.
func TestLivePageCopesWithEmptyAndLargeHistories(t *testing.T) {
	browser := requireChromium(t)
	load := func(url string) map[string]map[string]string {
		t.Helper()
		dom, err := chromium(t, browser, "--virtual-time-budget=2500", "--window-size=1400,1000", "--dump-dom", url)
		if err != nil {
			t.Fatal(err)
		}
		return byID(dom)
	}

	t.Run("empty", func(t *testing.T) {
		status := map[string]any{"peer_id": "12D3KooWself", "name": "lonely", "members": []any{}, "ring": map[string]any{"order": []string{}}, "links": []any{}}
		els := load(fakeAPI(t, status, nil))
		for _, id := range append(pageSeries, "series-eval-dots", "series-wait") {
			if n := attrInt(t, els, id, "data-points"); n != 0 {
				t.Errorf("#%s: %d points, want 0", id, n)
			}
		}
	})

	t.Run("large", func(t *testing.T) {
		const steps = 4000
		start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		var recs []map[string]any
		finite := 0
		for i := 1; i <= steps; i++ {
			r := map[string]any{"seq": len(recs) + 1, "time": start.Add(time.Duration(i) * 50 * time.Millisecond), "kind": "step", "step": i,
				"samples_per_s": 1000 + i%17, "bytes_sent": 270000, "step_s": 0.05, "compute_s": 0.03, "allreduce_s": 0.02, "codec": "sint8"}
			if i%9 != 0 { // every ninth record has no loss (JSON has no NaN)
				r["loss"] = 2.3 / float64(1+i/100)
				finite++
			}
			if i == 1 {
				r["wait_s"] = 40.0 // one long wait: the step-time axis is clipped above it
			}
			recs = append(recs, r)
			if i%100 == 0 {
				recs = append(recs, map[string]any{"seq": len(recs) + 1, "time": start.Add(time.Duration(i) * 50 * time.Millisecond), "kind": "eval", "step": i,
					"test_loss": 1.5, "bits_per_byte": 2.0 - float64(i)/steps})
			}
		}
		recs = append(recs, map[string]any{"seq": len(recs) + 1, "time": start.Add(time.Hour), "kind": "event", "step": steps, "event": "step_failed", "peer": "12D3KooWb", "msg": "late frame"})
		ring := []string{"12D3KooWa", "12D3KooWb", "12D3KooWc"}
		status := map[string]any{"peer_id": ring[0], "name": "a", "step": steps, "codec": "sint8",
			"members": []map[string]any{{"peer_id": ring[0], "name": "a", "state": "alive", "step": steps}, {"peer_id": ring[1], "name": "b", "state": "suspect", "step": steps}, {"peer_id": ring[2], "state": "alive", "step": steps - 1}},
			"ring":    map[string]any{"epoch": 4, "order": ring, "coordinator": ring[1], "link_codecs": []string{"sint8", "qsgd:bits=4"}},
			"links":   []map[string]any{{"peer": ring[1], "mbit_s": 940.5, "rtt_ms": 0.2}}}
		url := fakeAPI(t, status, recs)
		dom, err := chromium(t, browser, "--virtual-time-budget=2500", "--window-size=1400,1000", "--dump-dom", url)
		if err != nil {
			t.Fatal(err)
		}
		els := byID(dom)
		if n := attrInt(t, els, "series-loss", "data-points"); n != finite {
			t.Errorf("#series-loss: %d points, want the %d with a loss", n, finite)
		}
		for _, id := range []string{"series-loss", "series-rate", "series-bytes"} {
			if drawn := attrInt(t, els, id, "data-drawn"); drawn <= 0 || drawn >= finite/2 {
				t.Errorf("#%s: %d vertices drawn of %d points: not decimated", id, drawn, finite)
			}
		}
		if n := attrInt(t, els, "series-eval", "data-points"); n != steps/100 {
			t.Errorf("#series-eval: %d points, want %d bits-per-byte evaluations", n, steps/100)
		}
		if !bytes.Contains(dom, []byte("bits per byte")) {
			t.Error("the evaluation chart is not titled for bits per byte")
		}
		if !bytes.Contains(dom, []byte("clipped above the axis")) {
			t.Error("the step-time chart does not say it clipped the 40 s wait")
		}
		// The ring: three nodes, three links, the codec of each link (the
		// run's codec where the epoch names none), this peer's measured link.
		var nodes []string
		for _, el := range elements(dom, "data-peer") {
			if ringNode.MatchString(el["class"]) {
				nodes = append(nodes, el["data-peer"])
			}
		}
		if fmt.Sprint(nodes) != fmt.Sprint(ring) {
			t.Errorf("ring nodes %v, want %v in ring order", nodes, ring)
		}
		links := map[string]map[string]string{}
		for _, el := range elements(dom, "data-from") {
			links[el["data-from"]+">"+el["data-to"]] = el
		}
		for _, want := range []struct{ link, codec, mbit string }{
			{ring[0] + ">" + ring[1], "sint8", "940.5"}, {ring[1] + ">" + ring[2], "qsgd:bits=4", ""}, {ring[2] + ">" + ring[0], "sint8", ""},
		} {
			el, ok := links[want.link]
			if !ok {
				t.Errorf("no ring link %s", want.link)
				continue
			}
			if el["data-codec"] != want.codec || el["data-mbit-s"] != want.mbit {
				t.Errorf("ring link %s: codec %q, Mbit/s %q; want %q, %q", want.link, el["data-codec"], el["data-mbit-s"], want.codec, want.mbit)
			}
		}
		if !bytes.Contains(dom, []byte(`data-event="step_failed"`)) {
			t.Error("the event log lacks the failed step")
		}
	})
}
