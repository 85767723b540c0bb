"""The kit every host-to-host TCP protocol of the host program is made of: the supervisors' mesh
(run/peers.py), the detached waiters (share/waiter.py), the relay push (push/relay.py) and the bandwidth
test (net/bandwidth.py). Each protocol's own messages are written down at the top of its file; what they
share is here, once:

  lines.py      what travels: JSON lines (`Line` on a non-blocking socket, `parse_line`, `ProtocolError`;
                after the handshake every line of a line protocol carries a MAC: `Line.seal`), a line
                read from a blocking socket never past its newline (`read_line`: raw bytes may follow),
                bytes read exactly by a deadline (`recv_exact`; the loop is wire.read_exact)
  handshake.py  the one handshake, both ends (`Terms`: the protocol, the token and what the proofs
                cover; `Listening`, `Joining`; `join`: the joining end on a blocking socket)
  gate.py       the listening end's door (`Gatekeeper`): accept, let in only the allowed addresses,
                challenge, wait a short while for a proven hello, welcome (and seal); everything else is
                closed; the few waiting places are shared out so that nobody can hold them against the
                real joiners

The handshake (L: the listening end, J: the joining end; TOKEN: the secret the controller handed both
over SSH; MAC: keyed BLAKE2b, mac.py, in hex):
  L → J   {"challenge": NONCE_L, "for": PROTOCOL}
  J → L   {"hello": NODE, "nonce": NONCE_J, "done": BOOL, "mac": PROOF_J}
  L → J   {"welcome": NODE, "mac": PROOF_L}
     PROOF_J = MAC(TOKEN, "PROTOCOL|hello|CONTEXT|NODE|NONCE_L|NONCE_J|DONE")   (DONE 0 or 1)
     PROOF_L = MAC(TOKEN, "PROTOCOL|welcome|CONTEXT|NODE|NONCE_J|NONCE_L")
  PROTOCOL is mesh, wait, relay or bandwidth; CONTEXT what one use of it is about (the attempt key, the
  run, the pair); NODE who joins (a node rank, a place in the relay chain; 0 for the bandwidth test);
  DONE only the mesh sets (a peer whose ranks all ended before it joined). Nonces are 16 fresh random
  bytes (32 hex digits), a MAC 32 bytes (64). Each end proves it holds the token over the other end's
  fresh nonce, so neither a fake listener nor a replayed hello gets anywhere, and a proof made for one
  protocol, context or node is no proof for another. J sends nothing after its hello until it has the
  welcome; the relay's and the bandwidth test's L sends nothing after its welcome: raw bytes follow there,
  and neither end reads past the welcome's newline. The mesh's and the waiters' lines after the welcome
  are sealed (lines.py): each carries a MAC over its direction, a counter and the line, under a key of
  that connection's (Terms.session_key: the token's, bound to both nonces); the relay's and the bandwidth
  test's raw bytes are not (objects are checked by their SHA-256; a measurement is only that). A token
  under 16 bytes is refused (mac.py).

Nothing here is imported by a command that does not open such a channel (the push's start-up pays for
no socket it does not use: main.py).
"""
