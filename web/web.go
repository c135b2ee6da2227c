// Package web is the local API's live page: a self-contained HTML page, its
// script and its style sheet, embedded in the binary. The page polls the
// API's /status and /history and draws a run's curves, its ring and its
// events with its own SVG; it loads nothing from outside the API.
package web

import (
	"embed"
	"net/http"
	"strings"
)

//go:embed index.html app.js style.css
var files embed.FS

// AssetPrefix is the path under which the page's script and style sheet
// are served: AssetPrefix+"app.js" and AssetPrefix+"style.css".
const AssetPrefix = "/assets/"

// asset is one embedded file and the Content-Type it is served with.
type asset struct {
	name, contentType string
}

// assets maps request paths to files.
var assets = map[string]asset{
	"/":                       {"index.html", "text/html; charset=utf-8"},
	AssetPrefix + "app.js":    {"app.js", "text/javascript; charset=utf-8"},
	AssetPrefix + "style.css": {"style.css", "text/css; charset=utf-8"},
}

// csp lets the page load its own script, style and API answers only.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler returns the handler that serves the page at "/" and its assets
// under AssetPrefix; any other path is answered 404. Mount it for "GET /{$}"
// and "GET "+AssetPrefix.
func Handler() http.Handler {
	return http.HandlerFunc(serve)
}

func serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed: "+r.Method, http.StatusMethodNotAllowed)
		return
	}
	a, ok := assets[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	body, err := files.ReadFile(a.name)
	if err != nil { // cannot happen: every asset is embedded
		http.Error(w, "page asset "+a.name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	if strings.HasSuffix(a.name, ".html") {
		h.Set("Content-Security-Policy", csp)
		h.Set("Referrer-Policy", "no-referrer")
	}
	if r.Method == http.MethodHead {
		return
	}
	w.Write(body)
}
