"""Message authentication for the host programs' own TCP protocols (the handshake every one of them uses,
channel/handshake.py: the supervisors' mesh, the detached waiters, the relay push, the bandwidth test):
keyed BLAKE2b (RFC 7693's MAC mode, 32-byte tags) with the token the controller handed both ends over
SSH, and tags compared in constant time.

Why not hmac + hashlib: importing them loads OpenSSL's libcrypto, 3 ms of CPU in every supervisor of every
run on every host just to authenticate a handful of lines; BLAKE2b is built into CPython (_blake2) and is
a MAC when keyed, as HMAC-SHA256 is. (hashlib, when a host's Python lacks _blake2, has the same blake2b.)
"""

try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - every CPython 3.6+ has it
    from hashlib import blake2b
try:
    from _operator import _compare_digest as _same
except ImportError:  # pragma: no cover
    from hmac import compare_digest as _same

TAG = 32  # bytes (64 hex digits)
MIN_TOKEN = 16  # bytes: the controller's tokens are 16 random bytes in hex (32) or more; an empty or short
# one (a spec written by hand, a bug) would make every MAC guessable: refused, never used


class ShortToken(ValueError):
    """A token too short to authenticate anything."""


def _key(token):
    key = token.encode() if isinstance(token, str) else bytes(token)
    if len(key) < MIN_TOKEN:
        raise ShortToken("a token of %d bytes: at least %d are needed to authenticate" % (len(key), MIN_TOKEN))
    return key if len(key) <= 64 else blake2b(key).digest()  # BLAKE2b takes keys of up to 64 bytes


def check_token(token):
    """ShortToken unless token is long enough to be a key (the protocols check it before they listen)."""
    _key(token)


def tag(token, data):
    """The MAC of data (bytes) under token (the run's or the push's secret)."""
    return blake2b(data, key=_key(token), digest_size=TAG).digest()


def hex_tag(token, text):
    return tag(token, text.encode()).hex()


def same(given, expected):
    """Constant time (on bytes or ASCII strings)."""
    return _same(given, expected)
