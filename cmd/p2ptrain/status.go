package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/p2ptrain/p2ptrain/node"
)

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", stdout)
	api := fs.String("api", "127.0.0.1:7420", "the peer's local API `HOST:PORT`")
	asJSON := fs.Bool("json", false, "print the raw /status document")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	addr, err := apiAddress(*api)
	if err != nil {
		return usagef("status: --api: %v", err)
	}
	*api = addr
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+*api+"/status", nil)
	if err != nil {
		return usagef("status: bad --api %q: %v", *api, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("status: no p2ptrain peer answering at %s (is `p2ptrain join` running with --api %s?): %w", *api, *api, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("status: read reply from %s: %w", *api, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status: %s answered %s", *api, resp.Status)
	}
	if *asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var st node.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("status: %s sent an unreadable status document: %w", *api, err)
	}
	printStatus(stdout, st)
	return nil
}

func printStatus(w io.Writer, st node.Status) {
	fmt.Fprintf(w, "peer     %s (%s)\n", st.PeerID, st.Name)
	fmt.Fprintf(w, "cluster  %s, version %s, step %d\n", st.Cluster, st.Version, st.Step)
	fmt.Fprintf(w, "ring     epoch %d, %d members, coordinator %s\n", st.Ring.Epoch, len(st.Ring.Order), short(st.Ring.Coordinator))
	if st.Ring.Waiting != "" {
		fmt.Fprintf(w, "         waiting: %s\n", st.Ring.Waiting)
	}
	if len(st.Ring.Order) > 0 {
		var order []string
		for _, p := range st.Ring.Order {
			order = append(order, short(p))
		}
		fmt.Fprintf(w, "order    %s\n", strings.Join(order, " → "))
	}
	if st.Codec != "" {
		fmt.Fprintln(w, trainLine(st))
	}
	if st.TrainerWaiting != "" {
		fmt.Fprintf(w, "trainer  waiting %s\n", st.TrainerWaiting)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nPEER\tNAME\tSTATE\tLAST SEEN\tSTEP")
	for _, m := range st.Members {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", m.PeerID, m.Name, m.State,
			(time.Duration(m.LastSeenMS) * time.Millisecond).String(), m.Step)
	}
	tw.Flush()
}

// short abbreviates a peer ID for display.
func short(id string) string {
	if len(id) <= 12 {
		return id
	}
	return "…" + id[len(id)-8:]
}

// trainLine summarises a training peer's figures on one line.
func trainLine(st node.Status) string {
	f := func(p *float64, format string, scale float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf(format, *p*scale)
	}
	bytes := "-"
	if st.BytesPerStep != nil {
		bytes = humanBytes(*st.BytesPerStep)
	}
	hash := st.ParamHash
	if len(hash) > 16 {
		hash = hash[:16]
	}
	return fmt.Sprintf("train    step %d  loss %s  accuracy %s  %s samples/s  codec %s  %s/step sent  params %s",
		st.Step, f(st.Loss, "%.4f", 1), f(st.Accuracy, "%.2f%%", 100), f(st.SamplesPerS, "%.0f", 1), st.Codec, bytes, hash)
}

// apiAddress reads --api: HOST:PORT, or the URL a peer prints for its API
// (http://HOST:PORT/), as HOST:PORT.
func apiAddress(s string) (string, error) {
	t := strings.TrimSuffix(strings.TrimPrefix(s, "http://"), "/")
	host, port, err := net.SplitHostPort(t)
	if err != nil || host == "" {
		return "", fmt.Errorf("%q is not HOST:PORT (e.g. 127.0.0.1:7420)", s)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("%q: port %q is not a number from 1 to 65535", s, port)
	}
	return t, nil
}
