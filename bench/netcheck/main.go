// Command netcheck is the network-namespace benchmark's own probe (bench/netns.sh
// --check): a bounded TCP throughput test between two test hosts, used to verify
// that the tc shaping limits each host's link to the rate that was asked for.
//
//	netcheck serve --listen 10.77.0.11:5201 [--timeout 30s]
//	netcheck send --to 10.77.0.11:5201 --bytes 20MiB [--timeout 20s]
//
// serve accepts connections until its timeout, drains each one and answers with
// the number of bytes it received; send writes the bytes, waits for the answer
// and prints one JSON object {"bytes","seconds","mbit_s","rtt_ms"} on stdout
// (rtt_ms: how long the TCP handshake took, one round trip). Both exit by
// themselves when their timeout passes.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: netcheck serve|send [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "send":
		err = send(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (want serve or send)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "netcheck:", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", "", "TCP `HOST:PORT` to listen on")
	timeout := fs.Duration("timeout", 30*time.Second, "exit after this long")
	_ = fs.Parse(args)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(*timeout)
	_ = ln.(*net.TCPListener).SetDeadline(deadline)
	fmt.Fprintln(os.Stderr, "netcheck: listening on", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(deadline)
			n, _ := io.Copy(io.Discard, c)
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], uint64(n))
			_, _ = c.Write(b[:])
		}()
	}
}

func send(args []string) error {
	fs := flag.NewFlagSet("send", flag.ExitOnError)
	to := fs.String("to", "", "TCP `HOST:PORT` of a netcheck serve")
	size := fs.String("bytes", "20MiB", "how much to send (suffixes KiB, MiB, GiB, K, M, G)")
	timeout := fs.Duration("timeout", 20*time.Second, "give up after this long")
	_ = fs.Parse(args)
	n, err := parseSize(*size)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(*timeout)
	var c net.Conn
	var rtt time.Duration
	for {
		t0 := time.Now()
		c, err = net.DialTimeout("tcp", *to, time.Second)
		rtt = time.Since(t0)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	start := time.Now()
	buf := make([]byte, 256<<10)
	w := bufio.NewWriterSize(c, len(buf))
	for left := n; left > 0; {
		k := min(left, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		left -= k
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	var b [8]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return fmt.Errorf("reading the receiver's count: %w", err)
	}
	secs := time.Since(start).Seconds()
	got := int64(binary.BigEndian.Uint64(b[:]))
	if got != n {
		return fmt.Errorf("receiver got %d bytes, sent %d", got, n)
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"bytes":   n,
		"seconds": secs,
		"mbit_s":  float64(n) * 8 / secs / 1e6,
		"rtt_ms":  float64(rtt.Microseconds()) / 1e3,
	})
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return v * mult, nil
}
