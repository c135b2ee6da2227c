// Command p2ptrain is the peer-to-peer training daemon: `p2ptrain join` starts a
// peer; see `p2ptrain help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

// usageError marks errors caused by bad flags, arguments or config: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

const usage = `p2ptrain — peer-to-peer data-parallel training

Usage:
  p2ptrain keygen --swarm-key FILE     write a private-network key (share it with every machine)
  p2ptrain keygen --identity FILE      write a persistent peer identity; prints its peer ID
  p2ptrain join [flags]                start a peer and join the cluster; with --steps N, train
                                       (join -h lists flags)
  p2ptrain status [--api HOST:PORT] [--json]
                                       show a running peer's view of the cluster
  p2ptrain bench codecs [--size N] [--json]
                                       measure every gradient codec
  p2ptrain bench allreduce --inproc --peers N [--bandwidth R] [--size S] [--codec C] [--json]
                                       all-reduce over simulated links in this process
  p2ptrain bench allreduce --expect N [join flags] [--size S] [--codec C] [--json]
                                       all-reduce as a member of a real cluster
  p2ptrain bench train [--devices SET]... [--model M] [--batch-size N] [--steps N] [--json]
                                       local training speed (samples/s) per device set, e.g. cpu or cuda
  p2ptrain devices [--json]            list the CPU and the CUDA GPUs found, or why none is usable
  p2ptrain plot FILE... -o OUT.svg|OUT.png [--label NAME]... [--title T]
                                       draw training curves from metrics files (join --metrics-file)
  p2ptrain plan [--preset P] [--peers N] [--link R] [--rtt D] [--batch N] [--micro M] [--json]
                                       project the step time of data parallelism and of every
                                       pipeline layout (stages × replicas) from timed layers
  p2ptrain version                     print the version
`

// main runs the command. SIGINT and SIGTERM cancel it; a command they
// ended exits 128 + the signal's number (130, 143) once it has left
// cleanly, unless it failed for another reason (1 or 2).
func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	var got atomic.Int32
	go func() {
		if s, ok := (<-sigs).(syscall.Signal); ok {
			got.Store(int32(s))
		}
		cancel()
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	signal.Stop(sigs)
	cancel()
	os.Exit(exitCode(code, syscall.Signal(got.Load())))
}

// exitCode is the process's exit status for a command that returned code
// after signal sig (0: none) asked it to stop.
func exitCode(code int, sig syscall.Signal) int {
	if code == 0 && sig != 0 {
		return 128 + int(sig)
	}
	return code
}

// run executes one command line and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "keygen":
		err = cmdKeygen(args[1:], stdout, stderr)
	case "join":
		err = cmdJoin(ctx, args[1:], stdout, stderr)
	case "status":
		err = cmdStatus(ctx, args[1:], stdout, stderr)
	case "bench":
		err = cmdBench(ctx, args[1:], stdout, stderr)
	case "devices":
		err = cmdDevices(args[1:], stdout, stderr)
	case "plot":
		err = cmdPlot(args[1:], stdout)
	case "plan":
		err = cmdPlan(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "p2ptrain", version())
		return 0
	case "help", "-h", "--help":
		if len(args) > 1 && args[0] == "help" && args[1] != "help" {
			return run(ctx, append(args[1:len(args):len(args)], "--help"), stdout, stderr) // help CMD [SUB]: their own
		}
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = usagef("unknown command %q\n\n%s", args[0], usage)
	}
	if err == nil {
		return 0
	}
	if errors.Is(err, errHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "p2ptrain:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}
