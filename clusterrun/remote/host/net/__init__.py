"""Sockets the host program opens: a free port for the job, and listeners (the relay's, the supervisors'
coordinator) bound to this host's own address, the one the inventory names (`addr`), never to every
interface when that address is this host's."""

from ..stdlib import socket


def free_port():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def resolve_all(names):
    """The IP addresses these names and addresses stand for here (names that do not resolve are left out)."""
    out = set()
    for name in names:
        try:
            infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            continue
        for info in infos:
            ip = info[4][0]
            out.add(ip[7:] if ip.startswith("::ffff:") else ip)
    return out


BACKLOG = 1024  # every host of a large run may connect at once (128 peers to one coordinator); somaxconn caps it


def bind_address(addr, log=None, backlog=BACKLOG):
    """A listening TCP socket on a free port of addr (a name or an address of this host). When addr is
    not one of this host's (a NAT'ed or public address, a name that does not resolve here), it listens on
    every interface instead and says so through log: the connections it takes are still checked."""
    for family, sockaddr in _candidates(addr):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
        except OSError:
            sock.close()
            continue
        sock.listen(backlog)
        return sock
    if log is not None and addr:
        log("cannot bind %s (not an address of this host?): listening on every interface" % addr)
    ipv6 = ":" in (addr or "")
    sock = socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::" if ipv6 else "", 0))
    sock.listen(backlog)
    return sock


def _candidates(addr):
    """(family, sockaddr) to bind for addr. A name that resolves to a loopback address here (Debian's
    127.0.1.1 for the host's own name) is not what the other hosts reach: none then."""
    if not addr:
        return []
    try:
        infos = socket.getaddrinfo(addr, 0, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    literal = _is_ip(addr)
    return [(info[0], info[4]) for info in infos if literal or not _loopback(info[4][0])]


def _is_ip(text):
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, text)
            return True
        except (OSError, ValueError):
            pass
    return False


def _loopback(ip):
    return ip.startswith("127.") or ip == "::1"


def source_for(own, dest):
    """The local address to connect to dest from: own (this host's inventory address) when it is one of
    this host's and not a loopback address while dest is elsewhere; None to let the kernel choose."""
    ips = [ip for ip in resolve_all([own]) if _is_ip(own) or not _loopback(ip)] if own else []
    dest_loopback = any(_loopback(ip) for ip in resolve_all([dest]))
    for ip in ips:
        if _loopback(ip) and not dest_loopback:
            continue
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.bind((ip, 0))
            return ip
        except OSError:
            continue
        finally:
            sock.close()
    return None
