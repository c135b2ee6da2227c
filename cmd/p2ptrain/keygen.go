package main

import (
	"fmt"
	"io"

	"github.com/p2ptrain/p2ptrain/node"
)

func cmdKeygen(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keygen", stdout)
	swarm := fs.String("swarm-key", "", "write a private-network key (libp2p PSK v1) to `FILE`")
	ident := fs.String("identity", "", "write an Ed25519 peer identity to `FILE` and print its peer ID")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if (*swarm == "") == (*ident == "") {
		return usagef("keygen: give exactly one of --swarm-key FILE or --identity FILE")
	}
	if *swarm != "" {
		if err := node.WriteSwarmKey(*swarm); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote swarm key %s (mode 0600); copy it to every machine of the cluster\n", *swarm)
		return nil
	}
	id, err := node.WriteIdentity(*ident)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, id)
	return nil
}
