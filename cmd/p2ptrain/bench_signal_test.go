package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// signalTestArgs carries the command line of the process TestSignalHelper
// runs, its arguments separated by newlines.
const signalTestArgs = "P2PTRAIN_SIGNAL_TEST_ARGS"

// TestSignalHelper is not a test: in a process started by runSignalled it
// runs main, with its signal handling and exit code, on the command line
// of signalTestArgs.
func TestSignalHelper(t *testing.T) {
	args := os.Getenv(signalTestArgs)
	if args == "" {
		t.Skip("runs only as runSignalled's process")
	}
	os.Args = append([]string{"p2ptrain"}, strings.Split(args, "\n")...)
	main()
}

// cpuTicks returns the processor time process pid has used, in clock
// ticks (/proc/PID/stat's utime + stime).
func cpuTicks(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // after "pid (comm) "
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return utime + stime
}

// runSignalled runs p2ptrain args in a process of its own, sends it sig
// once it has used half a second of processor time (its handlers are then
// in place and the work under way: every command here runs for minutes
// unless stopped), and returns its exit code, its stderr and how long it
// took to exit after the signal. It fails the test if the process does
// not exit within the deadline.
func runSignalled(t *testing.T, sig syscall.Signal, args ...string) (code int, stderr string, took time.Duration) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSignalHelper$")
	cmd.Env = append(os.Environ(), signalTestArgs+"="+strings.Join(args, "\n"))
	var errb lockedBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer cmd.Process.Kill() //nolint:errcheck // gone already unless the test failed
	name := strings.Join(args, " ")
	ready := time.Now().Add(60 * time.Second)
	for cpuTicks(cmd.Process.Pid) < 50 {
		select {
		case err := <-done:
			t.Fatalf("%s exited before the signal: %v\n%s", name, err, errb.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(ready) {
			t.Fatalf("%s used no processor time in 60 s", name)
		}
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), errb.String(), time.Since(start)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still running 10 s after %v\nstderr: %s", name, sig, errb.String())
	}
	return 0, "", 0
}

// TestBenchAndPlanStopOnSignals checks that SIGINT and SIGTERM stop the
// long runs of bench and plan promptly, where the work itself does not
// watch for them (the codecs' timing, the layer profile, the in-process
// all-reduce's setup of many peers) too, and exit 130 and 143 with one
// line, as join does: no "context canceled", no aborted all-reduce, exit 1.
func TestBenchAndPlanStopOnSignals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, tc := range []struct {
		sig  syscall.Signal
		args []string
	}{
		{syscall.SIGINT, []string{"bench", "codecs", "--repeats", "100000000", "--codecs", "none"}},
		{syscall.SIGTERM, []string{"bench", "codecs", "--repeats", "100000000"}},
		{syscall.SIGINT, []string{"plan", "--preset", "tiny", "--reps", "100000000", "--cpu-costs=false"}},
		{syscall.SIGINT, []string{"bench", "train", "--steps", "100000000", "--batch-size", "16", "--data", "synthetic"}},
		{syscall.SIGINT, []string{"bench", "allreduce", "--inproc", "--peers", "4", "--size", "4MiB", "--rounds", "100000000"}},
		{syscall.SIGTERM, []string{"bench", "allreduce", "--inproc", "--peers", "1024", "--size", "4"}},
	} {
		code, stderr, took := runSignalled(t, tc.sig, tc.args...)
		want := 128 + int(tc.sig)
		line := "p2ptrain: " + strings.Join(tc.args[:min(2, len(tc.args))], " ")
		if tc.args[0] == "plan" {
			line = "p2ptrain: plan"
		}
		line += ": interrupted\n"
		if code != want || stderr != line {
			t.Errorf("%s after %v: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), tc.sig, code, stderr, want, line)
		}
		t.Logf("%s: exited %v after %v", strings.Join(tc.args, " "), took.Round(time.Millisecond), tc.sig)
	}
}

// TestInterruptedCommandsReturnCleanly checks, in this process, that a
// command whose context was canceled (main cancels it on SIGINT and
// SIGTERM) prints one line and returns no error, for main to exit 130 or
// 143, and measures nothing.
func TestInterruptedCommandsReturnCleanly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{
		{"bench", "codecs", "--size", "4096", "--repeats", "1", "--codecs", "none"},
		{"bench", "train", "--batch-size", "8", "--steps", "1", "--data", "synthetic"},
		{"bench", "allreduce", "--inproc", "--peers", "2", "--size", "4KiB", "--rounds", "1"},
		{"plan", "--preset", "tiny", "--reps", "1", "--cpu-costs=false"},
	} {
		var out, errb strings.Builder
		code := run(ctx, args, &out, &errb)
		cmd := strings.Join(args[:2], " ")
		if args[0] == "plan" {
			cmd = "plan"
		}
		if code != 0 || out.String() != "" || errb.String() != "p2ptrain: "+cmd+": interrupted\n" {
			t.Errorf("%s, interrupted: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out.String(), errb.String())
		}
	}
}
