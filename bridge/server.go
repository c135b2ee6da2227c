package bridge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Version is the protocol version this daemon speaks. Version 2: the
// process answers "averaged" with "applied" only when asked for its hash
// (its next step's messages confirm the update otherwise), and callback
// requests carry "after".
const Version = 2

// helloTimeout bounds the wait for a connection's hello, and for the
// callback connection after the main one's.
const helloTimeout = 30 * time.Second

// Options configure a Server.
type Options struct {
	// Peer is this peer's ID, told to the process.
	Peer string
	// Steps is train.steps: the run's length.
	Steps uint64
	// CheckEvery is train.check_every: the process hashes its parameters
	// after every such step.
	CheckEvery int
	// Log is the logger (nil: none).
	Log *zap.Logger
}

// Server listens on the Unix socket for the one training process of this
// daemon.
type Server struct {
	o    Options
	log  *zap.Logger
	ln   *net.UnixListener
	path string

	mu       sync.Mutex
	pending  map[string]*Learner // sessions whose callback connection has not come yet
	accepted chan *Learner
	busy     bool                  // a session was accepted: later hellos are refused
	hellos   map[net.Conn]struct{} // connections whose hello is being read
	wg       sync.WaitGroup
	quit     chan struct{}
}

// DefaultSocket returns the socket path for a daemon whose local API
// listens on api (HOST:PORT, or "" when it is off):
// $XDG_RUNTIME_DIR/p2ptrain-PORT.sock, else /tmp/p2ptrain-UID/PORT.sock.
func DefaultSocket(api string) string {
	port := "0"
	if _, p, err := net.SplitHostPort(api); err == nil && p != "" {
		port = p
	}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		return filepath.Join(dir, "p2ptrain-"+port+".sock")
	}
	return filepath.Join(os.TempDir(), "p2ptrain-"+strconv.Itoa(os.Getuid()), port+".sock")
}

// Listen creates the socket at path (mode 0600, in a directory it creates
// with mode 0700 when missing). A stale socket file that nobody listens on
// is replaced; a live one is an error.
func Listen(path string, o Options) (*Server, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("bridge: socket directory: %w", err)
	}
	if _, err := os.Stat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("bridge: another daemon listens on %s (set train.socket to another path)", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("bridge: removing the stale socket %s: %w", path, err)
		}
	}
	old := syscall.Umask(0o177) // the socket is created 0600
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("bridge: listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("bridge: %w", err)
	}
	s := &Server{o: o, log: o.Log.Named("bridge"), ln: ln, path: path, pending: map[string]*Learner{},
		hellos: map[net.Conn]struct{}{}, accepted: make(chan *Learner, 1), quit: make(chan struct{})}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Path returns the socket's path.
func (s *Server) Path() string { return s.path }

// Accept waits for a training process to register (its hello on the main
// connection, then its callback connection) and returns its session.
func (s *Server) Accept(ctx context.Context) (*Learner, error) {
	select {
	case l := <-s.accepted:
		return l, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops listening and removes the socket; sessions already accepted
// stay open until their Close.
func (s *Server) Close() error {
	close(s.quit)
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.hellos {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	for _, l := range s.pending {
		l.Close()
	}
	s.pending = nil
	s.mu.Unlock()
	select {
	case l := <-s.accepted: // registered, but nobody took it
		l.Close()
	default:
	}
	return err
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.quit:
			default:
				s.log.Error("accepting training processes stopped", zap.Error(err))
			}
			return
		}
		s.mu.Lock()
		s.hellos[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			err := s.handle(c)
			s.mu.Lock()
			delete(s.hellos, c)
			s.mu.Unlock()
			if err != nil {
				s.log.Warn("refused a training process", zap.Error(err))
				c.Close()
			}
		}()
	}
}

// handle reads a connection's hello and registers it.
func (s *Server) handle(c net.Conn) error {
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	body, err := readMsg(c)
	if err != nil {
		return fmt.Errorf("reading hello: %w", err)
	}
	var h hello
	if err := decode(body, &h); err != nil {
		return err
	}
	c.SetReadDeadline(time.Time{})
	refuse := func(kind string, err error) error {
		writeMsg(c, helloReply{OK: false, Kind: kind, Error: err.Error(), Version: Version})
		return err
	}
	switch {
	case h.Op != "hello":
		return refuse("version", fmt.Errorf("%w: the first message is %q, not hello", ErrBadMessage, h.Op))
	case h.Version != Version:
		return refuse("version", fmt.Errorf("bridge: protocol version %d; this daemon speaks %d", h.Version, Version))
	case h.Role == "callback":
		return s.attach(c, h.Session)
	case h.Role != "main":
		return refuse("version", fmt.Errorf("%w: role %q", ErrBadMessage, h.Role))
	}
	s.mu.Lock()
	busy := s.busy || len(s.pending) > 0
	s.mu.Unlock()
	if busy {
		return refuse("busy", fmt.Errorf("bridge: a training process (pid %d) is already registered with this daemon", h.PID))
	}
	l, err := s.register(c, &h)
	if err != nil {
		return refuse("layout", err)
	}
	r := helloReply{OK: true, Version: Version, Session: l.prefix, SHM: l.mem.path, SHMBytes: int64(len(l.mem.mem)),
		Peer: s.o.Peer, Steps: s.o.Steps}
	if err := writeMsg(c, r); err != nil {
		s.drop(l)
		return err
	}
	s.log.Info("training process registered", zap.Int("pid", h.PID), zap.Int("tensors", l.lay.tensors),
		zap.Int("values", l.lay.n), zap.Int("buckets", len(l.lay.sizes)), zap.Uint64("step", h.Step))
	time.AfterFunc(helloTimeout, func() {
		if s.drop(l) {
			s.log.Warn("the training process never opened its callback connection", zap.Int("pid", h.PID))
		}
	})
	return nil
}

// register checks a main hello and makes its session: the layout, the
// settings, the shared memory.
func (s *Server) register(c net.Conn, h *hello) (*Learner, error) {
	lay, err := parseLayout(h.Params, h.Buckets)
	if err != nil {
		return nil, err
	}
	settings, err := settingsOf(lay, h.Settings)
	if err != nil {
		return nil, err
	}
	if !hexHash.MatchString(h.Hash) {
		return nil, fmt.Errorf("%w: hash %q is not 64 lowercase hex digits", ErrLayout, h.Hash)
	}
	var id [8]byte
	rand.Read(id[:])
	prefix := fmt.Sprintf("p2ptrain-%d-%s", os.Getuid(), hex.EncodeToString(id[:]))
	dir := shmDir(filepath.Dir(s.path))
	mem, err := newSHM(filepath.Join(dir, prefix), lay.n)
	if err != nil {
		return nil, err
	}
	l := newLearner(s.log, c, mem, lay, settings, h, s.o, dir, prefix)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		l.Close()
		return nil, errors.New("bridge: the daemon is shutting down")
	}
	s.pending[prefix] = l
	return l, nil
}

// attach pairs a callback connection with its pending session.
func (s *Server) attach(c net.Conn, session string) error {
	s.mu.Lock()
	l, ok := s.pending[session]
	if ok {
		delete(s.pending, session)
		s.busy = true
	}
	s.mu.Unlock()
	if !ok {
		writeMsg(c, helloReply{OK: false, Kind: "version", Error: "unknown session"})
		return errors.New("bridge: a callback connection for an unknown session")
	}
	if err := writeMsg(c, helloReply{OK: true, Version: Version}); err != nil {
		l.Close()
		return err
	}
	l.start(c)
	s.accepted <- l
	return nil
}

// drop closes a session still waiting for its callback connection and
// reports whether it was one.
func (s *Server) drop(l *Learner) bool {
	s.mu.Lock()
	_, ok := s.pending[l.prefix]
	delete(s.pending, l.prefix)
	s.mu.Unlock()
	if ok {
		l.Close()
	}
	return ok
}
