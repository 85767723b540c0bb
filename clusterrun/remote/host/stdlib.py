"""The standard library's `json`, `socket` and `signal` as the host program uses them, made from their C
modules (_json, _socket, _signal) with the same names and behaviour for every call it makes.

Why: the Python modules around those C modules convert constants to enums as they are imported (socket's
address families and flags, signal's signals), and json compiles regular expressions (re, and enum again).
Measured on a test host with `python3 -S -c 'import X'` against `-c pass` (10.5 ms): socket +10.4 ms of
CPU, json +11.4, signal +7; together +18, against +2 for the C modules. The host program starts anew for
every push, follow and stop on every host, and its supervisor is a fork of the push: those milliseconds
were a tenth of a launch's CPU on every host (issue 37). tests/unit/test_host_imports.py checks that
the launch's path through the host program imports none of enum, re, json, socket, signal.

Where a C module is missing (an interpreter other than CPython), the Python module stands in.
"""

import sys

__all__ = ["json", "signal", "signal_names", "socket"]

# ---------------------------------------------------------------------------------------------- json


def _lean_json():
    import _json

    constants = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}

    class Context:  # what json.JSONDecoder() gives the C scanner
        strict = True
        object_hook = object_pairs_hook = None
        parse_float, parse_int, parse_constant = float, int, constants.__getitem__
        memo = {}

    scan = _json.make_scanner(Context())

    def default(obj):
        raise TypeError("Object of type %s is not JSON serializable" % type(obj).__name__)

    # json.dumps(obj) with its defaults: ASCII, ", " and ": ", NaN allowed (circular references are not
    # checked: the host program writes trees it builds itself)
    encode = _json.make_encoder(None, default, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True)
    blank = " \t\n\r"

    def dumps(obj):
        return "".join(encode(obj, 0))

    def loads(text):
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "surrogatepass")
        start = len(text) - len(text.lstrip(blank))
        try:
            obj, end = scan(text, start)
        except StopIteration as exc:
            raise ValueError("Expecting value: char %d" % exc.value) from None
        if text[end:].strip(blank):
            raise ValueError("Extra data: char %d" % end)
        return obj

    def dump(obj, fh):
        fh.write(dumps(obj))

    def load(fh):
        return loads(fh.read())

    module = type(sys)("json")
    module.__dict__.update(dumps=dumps, loads=loads, dump=dump, load=load)
    return module


try:
    json = _lean_json()
except (ImportError, AttributeError, TypeError):  # no _json, or one whose constructors take other arguments
    import json  # noqa: F811 - the Python module

# -------------------------------------------------------------------------------------------- socket


def _lean_socket():
    import _socket

    class Socket(_socket.socket):
        """socket.socket's parts beyond _socket's that the host program uses: accept() returns a socket,
        and `with` closes it."""

        __slots__ = ["__weakref__"]

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.close()

        def accept(self):
            fd, addr = self._accept()
            sock = Socket(self.family, self.type, self.proto, fileno=fd)
            if _socket.getdefaulttimeout() is None and self.gettimeout():
                sock.setblocking(True)  # as socket.accept: a listener with a timeout hands out blocking sockets
            return sock, addr

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        """_socket.getaddrinfo, an ASCII name handed over as bytes: a str goes through the idna codec,
        whose first use loads encodings.idna, and with it re, enum and unicodedata (~10 ms of a process).
        An ASCII name encodes to the same bytes; a bad one (`a..b`, a label over 63) fails as OSError."""
        if isinstance(host, str) and host.isascii():
            host = host.encode("ascii")
        return _socket.getaddrinfo(host, port, family, type, proto, flags)

    default = object()

    def create_connection(address, timeout=default, source_address=None):
        """socket.create_connection: each address the name resolves to in turn, the last error raised."""
        host, port = address
        error = None
        for family, kind, proto, _name, sockaddr in getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
            sock = None
            try:
                sock = Socket(family, kind, proto)
                if timeout is not default:
                    sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                error = exc
                if sock is not None:
                    sock.close()
        if error is not None:
            raise error
        raise OSError("getaddrinfo returns an empty list")

    module = type(sys)("socket")
    module.__dict__.update((k, v) for k, v in vars(_socket).items() if not k.startswith("_"))
    module.__dict__.update(socket=Socket, SocketType=Socket, create_connection=create_connection, getaddrinfo=getaddrinfo,
                           timeout=getattr(_socket, "timeout", TimeoutError))
    return module


try:
    socket = _lean_socket()
except ImportError:
    import socket  # noqa: F811 - the Python module

# -------------------------------------------------------------------------------------------- signal

try:
    import _signal as signal  # signal.signal() & co. with ints: what signal.py wraps in enums
except ImportError:
    import signal  # noqa: F811 - the Python module


def signal_names():
    """{number: name} as signal.Signals(number).name says it (of two names for one number, SIGABRT and
    SIGIOT, the first in sorted order, as the enum keeps it)."""
    found = sorted((v, k) for k, v in vars(signal).items()
                   if k.startswith("SIG") and not k.startswith("SIG_") and isinstance(v, int))
    names = {}
    for number, name in found:
        names.setdefault(number, name)
    return names
