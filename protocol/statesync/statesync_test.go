package statesync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/p2ptrain/p2ptrain/internal/p2ptest"
	"go.uber.org/zap/zaptest"
)

// TestFetch: the state arrives whole; a wrong step, a refused peer, a
// source that serves nothing and a state above the client's bound are each
// their own error.
func TestFetch(t *testing.T) {
	srv, cli, other := p2ptest.Host(t), p2ptest.Host(t), p2ptest.Host(t)
	p2ptest.Connect(t, srv, cli, other)
	state := bytes.Repeat([]byte("state"), 1000)
	s := NewServer(srv, zaptest.NewLogger(t))
	s.SetSource(func(from string, step uint64) ([]byte, error) {
		switch {
		case from != cli.ID().String():
			return nil, fmt.Errorf("%w: %s is not a member", ErrRefused, from)
		case step != 7:
			return nil, fmt.Errorf("%w: at step 7", ErrUnavailable)
		}
		return state, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := Fetch(ctx, cli, srv.ID(), 7, 0)
	if err != nil || !bytes.Equal(got, state) {
		t.Fatalf("Fetch = %d bytes, %v", len(got), err)
	}
	if _, err := Fetch(ctx, cli, srv.ID(), 8, 0); !errors.Is(err, ErrUnavailable) {
		t.Errorf("wrong step: %v, want ErrUnavailable", err)
	}
	if _, err := Fetch(ctx, other, srv.ID(), 7, 0); !errors.Is(err, ErrRefused) {
		t.Errorf("a peer the source refuses: %v, want ErrRefused", err)
	}
	if _, err := Fetch(ctx, cli, srv.ID(), 7, uint64(len(state)-1)); err == nil {
		t.Error("a state above the client's bound was accepted")
	}
	s.SetSource(nil)
	if _, err := Fetch(ctx, cli, srv.ID(), 7, 0); err == nil {
		t.Error("fetched from a server that serves nothing")
	}
}

// TestFetchStage: a stage-state request names the stage, which the source
// receives; the state arrives whole, and a stage out of range, a wrong
// step and a server without a stage source are each an error. The plain
// state protocol is served apart.
func TestFetchStage(t *testing.T) {
	srv, cli := p2ptest.Host(t), p2ptest.Host(t)
	p2ptest.Connect(t, srv, cli)
	s := NewServer(srv, zaptest.NewLogger(t))
	s.SetStageSource(func(from string, step uint64, stage int) ([]byte, error) {
		if step != 7 {
			return nil, fmt.Errorf("%w: at step 7", ErrUnavailable)
		}
		return bytes.Repeat([]byte{byte(stage)}, 100+stage), nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, stage := range []int{0, 3, MaxStage - 1} {
		got, err := FetchStage(ctx, cli, srv.ID(), 7, stage, 0)
		if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{byte(stage)}, 100+stage)) {
			t.Fatalf("stage %d: %d bytes, %v", stage, len(got), err)
		}
	}
	if _, err := FetchStage(ctx, cli, srv.ID(), 8, 1, 0); !errors.Is(err, ErrUnavailable) {
		t.Errorf("wrong step: %v, want ErrUnavailable", err)
	}
	for _, stage := range []int{-1, MaxStage} {
		if _, err := FetchStage(ctx, cli, srv.ID(), 7, stage, 0); err == nil {
			t.Errorf("stage %d: no error", stage)
		}
	}
	if _, err := Fetch(ctx, cli, srv.ID(), 7, 0); err == nil {
		t.Error("the plain state protocol answered without a source")
	}
	s.SetStageSource(nil)
	if _, err := FetchStage(ctx, cli, srv.ID(), 7, 1, 0); err == nil {
		t.Error("fetched a stage from a server that serves none")
	}
}

// TestFetchLayout: the layout description arrives whole, from a server
// that serves it apart from the states; one that serves none is an error.
func TestFetchLayout(t *testing.T) {
	srv, cli := p2ptest.Host(t), p2ptest.Host(t)
	p2ptest.Connect(t, srv, cli)
	s := NewServer(srv, zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := FetchLayout(ctx, cli, srv.ID()); err == nil {
		t.Fatal("fetched a layout from a server that serves none")
	}
	layout := []byte(`{"params":[{"name":"fc.weight","shape":[10,64]}]}`)
	s.SetLayoutSource(func(from string) ([]byte, error) {
		if from != cli.ID().String() {
			return nil, fmt.Errorf("%w: %s", ErrRefused, from)
		}
		return layout, nil
	})
	got, err := FetchLayout(ctx, cli, srv.ID())
	if err != nil || !bytes.Equal(got, layout) {
		t.Fatalf("FetchLayout = %q, %v", got, err)
	}
	if _, err := Fetch(ctx, cli, srv.ID(), 0, 0); err == nil {
		t.Error("the layout source served a state")
	}
	s.SetLayoutSource(nil)
	if _, err := FetchLayout(ctx, cli, srv.ID()); err == nil {
		t.Error("fetched a layout after the source stopped")
	}
}
