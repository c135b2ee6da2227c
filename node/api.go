package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/p2ptrain/p2ptrain/telemetry"
	"github.com/p2ptrain/p2ptrain/web"
)

// historyDoc is the /history document: the records after ?since=N (all
// those kept without it), oldest first, and the number to pass as since
// next time.
type historyDoc struct {
	Records []telemetry.Record `json:"records"`
	Last    uint64             `json:"last"`
}

// apiServer serves the live page (/), /status, /history and /metrics on a
// local address.
type apiServer struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
}

func startAPI(addr string, n *Node, log *zap.Logger) (*apiServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("node: local API on %s: %w (set node.api or --api to another address, or \"\" to turn it off)", addr, err)
	}
	reg := newRegistry(n)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(n.Status()); err != nil {
			log.Debug("write /status", zap.Error(err))
		}
	})
	mux.HandleFunc("GET /history", func(w http.ResponseWriter, r *http.Request) {
		var since uint64
		if v := r.URL.Query().Get("since"); v != "" {
			var err error
			if since, err = strconv.ParseUint(v, 10, 64); err != nil {
				http.Error(w, "since: not a record number: "+v, http.StatusBadRequest)
				return
			}
		}
		recs, last := n.History(since)
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(historyDoc{Records: recs, Last: last}); err != nil {
			log.Debug("write /history", zap.Error(err))
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	page := web.Handler() // the live page: / and its assets
	mux.Handle("GET /{$}", page)
	mux.Handle("GET "+web.AssetPrefix, page)
	s := &apiServer{
		ln: ln,
		srv: &http.Server{Handler: apiHandler(mux, n.cfg.Node.APIPublic), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("local API stopped", zap.Error(err))
		}
	}()
	log.Info("local API listening", zap.String("addr", ln.Addr().String()))
	return s, nil
}

func (s *apiServer) addr() string { return s.ln.Addr().String() }

func (s *apiServer) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}

// apiHandler guards mux against DNS rebinding (rebindGuard) unless the
// operator opened the API to the network (node.api_public): then anyone
// who can reach it may, by any name (a Prometheus server scraping it by
// its fully qualified name), and a page's rebinding adds nothing.
func apiHandler(mux http.Handler, public bool) http.Handler {
	if public {
		return mux
	}
	return rebindGuard(mux, hostname())
}

// rebindGuard answers only requests addressed to an IP address, to
// localhost (or a name under .localhost) or to this machine's own name
// (self; "" for none): a web page on a name its owner points at 127.0.0.1
// (DNS rebinding) sends its own name as the Host and so cannot read the
// API from a browser on this machine. Anything else gets 421 Misdirected
// Request with the reason.
func rebindGuard(next http.Handler, self string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !localHost(r.Host, self) {
			http.Error(w, fmt.Sprintf("p2ptrain's local API answers requests for an IP address, localhost or %q, not %q (a guard against DNS rebinding; reach it through ssh -L)", self, r.Host), http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// localHost reports whether a request's Host header (with or without a
// port) names an IP address, localhost, a name under .localhost, or self,
// or is empty (an HTTP/1.0 client; a browser always sends one).
func localHost(hostport, self string) bool {
	if hostport == "" {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return host == "localhost" || strings.HasSuffix(host, ".localhost") || (self != "" && host == strings.ToLower(self))
}

// hostname is this machine's name, or "" when the system has none.
func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}
