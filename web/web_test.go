package web

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// get serves one request through a mux mounted the way node/api.go mounts
// the page.
func get(t *testing.T, method, path string) *http.Response {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", Handler())
	mux.Handle("GET "+AssetPrefix, Handler())
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

// external matches a reference that would make a browser load something
// from another origin: an absolute or protocol-relative src or href, a CSS
// url() or @import of one, or a fetch of one.
var external = regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?\s*(https?:)?//|url\(\s*["']?\s*(https?:)?//|@import|fetch\(\s*["'](https?:)?//`)

func TestPageIsServedWithNoExternalURL(t *testing.T) {
	resp := get(t, http.MethodGet, "/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /: status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("GET /: Content-Type %q", ct)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("GET /: Content-Security-Policy %q does not confine the page to its own origin", csp)
	}
	html := body(t, resp)
	for _, want := range []string{`<svg id="chart-loss"`, `<svg id="ring"`, `id="members"`, `id="events"`,
		`src="` + AssetPrefix + `app.js"`, `href="` + AssetPrefix + `style.css"`} {
		if !strings.Contains(html, want) {
			t.Errorf("GET /: the page lacks %s", want)
		}
	}
	if m := external.FindString(html); m != "" {
		t.Errorf("GET /: the page refers to another origin: %q", m)
	}
	for _, name := range []string{"app.js", "style.css"} {
		if m := external.FindString(body(t, get(t, http.MethodGet, AssetPrefix+name))); m != "" {
			t.Errorf("%s refers to another origin: %q", name, m)
		}
	}
}

func TestAssetsHaveTheirContentTypes(t *testing.T) {
	for path, want := range map[string]string{
		"/":                       "text/html; charset=utf-8",
		AssetPrefix + "app.js":    "text/javascript; charset=utf-8",
		AssetPrefix + "style.css": "text/css; charset=utf-8",
	} {
		resp := get(t, http.MethodGet, path)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: status %d", path, resp.StatusCode)
			continue
		}
		if ct := resp.Header.Get("Content-Type"); ct != want {
			t.Errorf("GET %s: Content-Type %q, want %q", path, ct, want)
		}
		if n := resp.Header.Get("X-Content-Type-Options"); n != "nosniff" {
			t.Errorf("GET %s: X-Content-Type-Options %q, want nosniff", path, n)
		}
		if b := body(t, resp); len(b) < 100 {
			t.Errorf("GET %s: %d bytes", path, len(b))
		}
		if head := get(t, http.MethodHead, path); head.StatusCode != http.StatusOK || body(t, head) != "" {
			t.Errorf("HEAD %s: status %d, want 200 and no body", path, head.StatusCode)
		}
	}
}

func TestUnknownPathsAreNotFound(t *testing.T) {
	for _, path := range []string{AssetPrefix + "missing.js", AssetPrefix, AssetPrefix + "index.html", AssetPrefix + "web.go", "/index.html"} {
		if resp := get(t, http.MethodGet, path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", path, resp.StatusCode)
		}
	}
	// The handler alone (mounted elsewhere) refuses other methods.
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /: status %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
}
