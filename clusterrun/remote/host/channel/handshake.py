"""The one handshake of the hosts' own channels, both ends (the messages and proofs: __init__)."""

import os

from ..mac import check_token, hex_tag, same, tag
from .lines import ProtocolError, pack, read_line

NONCE_HEX = 32
MAC_HEX = 64


def fresh_nonce():
    return os.urandom(NONCE_HEX // 2).hex()


def is_hex(value, length):
    return isinstance(value, str) and len(value) == length and all(c in "0123456789abcdef" for c in value)


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def same_proof(given, expected):
    """Constant-time, on bytes; anything that is not a proof of the right shape is simply wrong."""
    return is_hex(given, MAC_HEX) and same(given.encode("ascii"), expected.encode("ascii"))


class Terms:
    """What both ends of one protocol's channel agree on: its name, the token, what the proofs cover
    (context: the attempt key, the run, the pair), and how an error names the token."""

    def __init__(self, protocol, token, context, secret="the run's token"):
        check_token(token)  # mac.ShortToken for an empty or short one: nothing is ever proven with it
        self.protocol, self.token, self.context, self.secret = protocol, token, str(context), secret

    def hello_proof(self, node, nonce_l, nonce_j, done):
        return hex_tag(self.token, "%s|hello|%s|%d|%s|%s|%d" % (self.protocol, self.context, node, nonce_l,
                                                                 nonce_j, 1 if done else 0))

    def welcome_proof(self, node, nonce_j, nonce_l):
        return hex_tag(self.token, "%s|welcome|%s|%d|%s|%s" % (self.protocol, self.context, node, nonce_j,
                                                                nonce_l))

    def session_key(self, node, nonce_l, nonce_j):
        """The key of one connection's messages after the handshake (lines.Line.seal): the token's, bound to
        both fresh nonces, so no message of another connection, run or protocol passes on this one."""
        return tag(self.token, ("%s|session|%s|%d|%s|%s" % (self.protocol, self.context, node, nonce_l,
                                                             nonce_j)).encode())


class Listening:
    """The listening end of one handshake: its challenge out, a hello checked, the welcome."""

    def __init__(self, terms):
        self.terms = terms
        self.nonce = fresh_nonce()

    def challenge(self):
        return {"challenge": self.nonce, "for": self.terms.protocol}

    def check_hello(self, msg, expect):
        """The node a hello names, once it is one of expect and proves the token; ProtocolError otherwise."""
        node = msg.get("hello")
        if not (is_int(node) and node in expect and is_hex(msg.get("nonce"), NONCE_HEX)
                and isinstance(msg.get("done"), bool)):
            raise ProtocolError("not a hello")
        if not same_proof(msg.get("mac"), self.terms.hello_proof(node, self.nonce, msg["nonce"], msg["done"])):
            raise ProtocolError("node %d's hello did not prove %s" % (node, self.terms.secret))
        return node

    def welcome(self, node, hello):
        return {"welcome": node, "mac": self.terms.welcome_proof(node, hello["nonce"], self.nonce)}

    def session_key(self, node, hello):
        return self.terms.session_key(node, self.nonce, hello["nonce"])


class Joining:
    """The joining end of one handshake: the hello answering a challenge, the welcome checked."""

    def __init__(self, terms, node):
        self.terms, self.node = terms, node
        self.challenge = self.nonce = None

    def hello(self, msg, done=False):
        """The hello that answers msg, the listener's challenge; ProtocolError for anything else."""
        if msg.get("for") != self.terms.protocol or not is_hex(msg.get("challenge"), NONCE_HEX):
            raise ProtocolError("not a challenge of clusterrun's %s" % self.terms.protocol)
        self.challenge, self.nonce = msg["challenge"], fresh_nonce()
        return {"hello": self.node, "nonce": self.nonce, "done": bool(done),
                "mac": self.terms.hello_proof(self.node, self.challenge, self.nonce, done)}

    def check_welcome(self, msg):
        expected = self.terms.welcome_proof(self.node, self.nonce, self.challenge)
        if msg.get("welcome") != self.node or not same_proof(msg.get("mac"), expected):
            raise ProtocolError("the other end did not prove %s" % self.terms.secret)

    def session_key(self):
        return self.terms.session_key(self.node, self.challenge, self.nonce)


class JoinError(ProtocolError):
    """The joining end's handshake failed; stage: "challenge" (no challenge of this protocol came),
    "accepted" (nothing after the hello: the listener refused it), "proof" (a welcome that proves nothing)."""

    def __init__(self, stage, why):
        ProtocolError.__init__(self, why)
        self.stage = stage


def join(sock, terms, node, deadline, done=False):
    """The joining end on a blocking, connected socket, by deadline (time.monotonic()); JoinError otherwise."""
    joining = Joining(terms, node)
    try:
        hello = joining.hello(read_line(sock, deadline), done)
    except ProtocolError as exc:
        raise JoinError("challenge", str(exc)) from None
    sock.sendall(pack(hello))
    try:
        welcome = read_line(sock, deadline)
    except ProtocolError as exc:
        raise JoinError("accepted", str(exc)) from None
    try:
        joining.check_welcome(welcome)
    except ProtocolError as exc:
        raise JoinError("proof", str(exc)) from None
    return joining
