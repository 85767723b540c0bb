"""Which network interface this host's ranks should use (network: {ifname: auto}): the one that carries
its route to rank 0's addr, and on rank 0's host the one that holds that address itself.

gloo binds to the address the host's own name resolves to (127.0.1.1 on Debian and Ubuntu: loopback, so
the other hosts get "Connection refused, remote=[127.0.1.1]"), and NCCL to the first interface it
likes (docker0, a second NIC); GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME set to the interface found
here make both use the network that leads to rank 0.

Found from the kernel's own tables: /proc/net/route and /proc/net/ipv6_route (the main routing
table: the longest prefix that matches, then the lowest metric), /proc/net/if_inet6 (IPv6
addresses), /sys/class/net (names, MTU, state) and SIOCGIFADDR (each interface's IPv4 address); `ip`
only where those cannot be read (not Linux, a /proc without them) or say nothing. The parsers and
`choose` are pure (text in), so they are tested on canned tables; `System` reads the real ones and
`find` puts it together. Policy routing (ip rule) is not looked at: the main table is what most
hosts have.

Used by the push's facts (push/facts.py: no extra round trip), by `check`'s probe (its
source rides along: hosts/probe.py) and by `bandwidth`.
"""

import os
import struct
import time

try:
    from ..stdlib import socket
except ImportError:  # loaded from its source alone by check's probe (remote/probe.py: no package)
    import socket

RTF_UP = 0x1
RTF_REJECT = 0x200  # unreachable / prohibit / blackhole
SIOCGIFADDR = 0x8915
LOOKUP_TIMEOUT = 2.0  # a dead DNS makes getaddrinfo wait 5 s per server and try: never hold a push that long
MAX_INTERFACES = 64  # a docker host has a veth per container: enough to name the ones that matter


def _int_of(addr):
    """(family, integer, bits) of an address literal; ValueError when it is not one."""
    for family, bits in ((socket.AF_INET, 32), (socket.AF_INET6, 128)):
        try:
            packed = socket.inet_pton(family, addr.split("%")[0])
        except (OSError, ValueError):
            continue
        return family, int.from_bytes(packed, "big"), bits
    raise ValueError("not an IP address: %r" % (addr,))


def is_ip(text):
    try:
        _int_of(text)
        return True
    except ValueError:
        return False


def is_loopback(addr):
    try:
        family, value, _ = _int_of(addr)
    except ValueError:
        return False
    return value >> 24 == 127 if family == socket.AF_INET else value == 1


def _ntoa4(value):
    return socket.inet_ntop(socket.AF_INET, struct.pack(">I", value))


def _proc_v4(hex8):
    """An address of /proc/net/route: the network-order bytes printed as a native integer."""
    return struct.unpack(">I", struct.pack("=I", int(hex8, 16)))[0]


def _ntoa6(hex32):
    return socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hex32))


# ------------------------------------------------------------------ parsers (pure)


def parse_route(text):
    """/proc/net/route → [{iface, net, prefix, gateway, metric}], up routes only; iface None where the
    route leads nowhere (blackhole, unreachable: the kernel shows "*")."""
    out = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8:
            continue
        try:
            dest, gateway, mask = _proc_v4(cols[1]), _proc_v4(cols[2]), _proc_v4(cols[7])
            flags, metric = int(cols[3], 16), int(cols[6])
        except (ValueError, struct.error):
            continue
        if not flags & RTF_UP:
            continue
        iface = None if cols[0] == "*" or flags & RTF_REJECT else cols[0]
        out.append({"iface": iface, "net": _ntoa4(dest), "prefix": bin(mask).count("1"),
                    "gateway": _ntoa4(gateway) if gateway else "", "metric": metric})
    return out


def parse_ipv6_route(text):
    """/proc/net/ipv6_route → the same records as parse_route (reject routes: iface None)."""
    out = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 10 or len(cols[0]) != 32:
            continue
        try:
            prefix, metric, flags = int(cols[1], 16), int(cols[5], 16), int(cols[8], 16)
            net, gateway = _ntoa6(cols[0]), _ntoa6(cols[4])
        except ValueError:
            continue
        if not flags & RTF_UP:
            continue
        iface = None if flags & RTF_REJECT else cols[9]
        out.append({"iface": iface, "net": net, "prefix": prefix,
                    "gateway": "" if gateway == "::" else gateway, "metric": metric})
    return out


def parse_if_inet6(text):
    """/proc/net/if_inet6 → [(iface, address)]."""
    out = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 6 and len(cols[0]) == 32:
            try:
                out.append((cols[5], _ntoa6(cols[0])))
            except ValueError:
                continue
    return out


def parse_ip_addr(text):
    """`ip -o addr show` → [(iface, address)] (both families)."""
    out = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[2] in ("inet", "inet6"):
            out.append((cols[1].rstrip(":").split("@")[0], cols[3].split("/")[0]))
    return out


def parse_ip_route_get(text):
    """`ip -o route get DEST` → the interface after "dev" ("" when the answer names none)."""
    cols = text.split()
    for i, word in enumerate(cols[:-1]):
        if word == "dev":
            return cols[i + 1]
    return ""


# ------------------------------------------------------------------ the choice (pure)


def _matches(value, bits, net, prefix):
    try:
        family, net_value, net_bits = _int_of(net)
    except ValueError:
        return False
    if net_bits != bits:
        return False
    shift = bits - prefix
    return value >> shift == net_value >> shift


def best_route(dest, routes):
    """The route the main table uses for dest: the longest matching prefix, then the lowest metric."""
    _, value, bits = _int_of(dest)
    best = None
    for r in routes:
        if _matches(value, bits, r["net"], r["prefix"]) and \
                (best is None or (r["prefix"], -r["metric"]) > (best["prefix"], -best["metric"])):
            best = r
    return best


def route_text(r):
    where = "default route" if r["prefix"] == 0 else "route %s/%d" % (r["net"], r["prefix"])
    return where + (" via %s" % r["gateway"] if r["gateway"] else "")


def choose(dest, addrs, routes, route_get=None):
    """(ifname or None, why) for traffic to dest (an IP): the interface that holds dest (rank 0's own
    host), else the one of the main table's best route, else what `ip route get` says (route_get: a
    function dest → its output, or None)."""
    _int_of(dest)
    held = [name for name, addr in addrs if same_address(addr, dest)]
    if held:
        return held[0], "%s holds %s itself" % (held[0], dest)
    if is_loopback(dest):
        return "lo", "%s is a loopback address" % dest
    r = best_route(dest, routes)
    if r is not None and r["iface"] is None:
        return None, "the %s to %s is a blackhole (unreachable)" % (route_text(r), dest)
    if r is not None:
        return r["iface"], "%s carries the %s to %s" % (r["iface"], route_text(r), dest)
    got = parse_ip_route_get(route_get(dest)) if route_get is not None else ""
    if got:
        return got, "%s carries the route to %s (ip route get)" % (got, dest)
    return None, "no route to %s" % dest


def same_address(a, b):
    """Two spellings of one address (::ffff:10.0.0.1 is not 10.0.0.1: an IPv6 socket's peers are)."""
    try:
        return _int_of(a)[:2] == _int_of(b)[:2]
    except ValueError:
        return False


# ------------------------------------------------------------------ this host


class System:
    """The real sources; tests hand `find` an object with the same methods and canned text."""

    def read(self, path):
        """A file's text, or None when it cannot be read."""
        try:
            with open(path) as fh:
                return fh.read()
        except (OSError, UnicodeDecodeError):
            return None

    def names(self):
        try:
            return sorted(os.listdir("/sys/class/net"))
        except OSError:
            try:
                return sorted(name for _, name in socket.if_nameindex())
            except (OSError, AttributeError):
                return []

    def ipv4(self, name):
        """The interface's IPv4 address (SIOCGIFADDR: the primary one), or None."""
        try:
            import fcntl
        except ImportError:
            return None
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            got = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            return socket.inet_ntoa(got[20:24])
        except OSError:
            return None
        finally:
            sock.close()

    def run(self, argv):
        """A command's output ("" when it cannot run): `ip`, only as the fallback."""
        import subprocess  # the push finds the interface without it: its import is paid only here

        try:
            return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=2.0,
                                  check=False).stdout.decode("utf-8", "replace")
        except (OSError, subprocess.SubprocessError):
            return ""


def interfaces(system):
    """[{name, up, mtu, addrs}] of this host's interfaces (loopback included)."""
    names = system.names()[:MAX_INTERFACES]
    v6 = parse_if_inet6(system.read("/proc/net/if_inet6") or "")
    table = {}
    for name in names:
        mtu = (system.read("/sys/class/net/%s/mtu" % name) or "").strip()
        state = (system.read("/sys/class/net/%s/operstate" % name) or "").strip()
        v4 = system.ipv4(name)
        table[name] = {"name": name, "up": state in ("up", "unknown", ""), "mtu": int(mtu) if mtu.isdigit() else None,
                       "addrs": ([v4] if v4 else []) + [a for n, a in v6 if n == name]}
    if not any(i["addrs"] for i in table.values()):  # no /sys, no ioctl: ask `ip`
        for name, addr in parse_ip_addr(system.run(["ip", "-o", "addr", "show"])):
            table.setdefault(name, {"name": name, "up": True, "mtu": None, "addrs": []})["addrs"].append(addr)
    return list(table.values())


def lookup(name, timeout=LOOKUP_TIMEOUT):
    """(addresses, seconds, error) of a name lookup that gives up after timeout."""
    return lookup_many([name], timeout)[name]


def lookup_many(names, timeout=LOOKUP_TIMEOUT):
    """{name: (addresses, seconds, error)}, every lookup at once, none waited for past timeout (a thread
    each: getaddrinfo cannot be interrupted, and a dead DNS must not hold up whoever asked)."""
    boxes = {}

    def resolve(name, box):
        try:
            box["addrs"] = [info[4][0] for info in socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)]
        except (OSError, UnicodeError) as exc:
            box["error"] = str(exc)
        box["seconds"] = round(time.time() - box["t0"], 3)

    import threading  # `check`'s lookups only

    for name in names:
        if name not in boxes:
            boxes[name] = {"t0": time.time()}
            worker = threading.Thread(target=resolve, args=(name, boxes[name]), name="lookup")
            worker.daemon = True
            worker.start()
            boxes[name]["thread"] = worker
    deadline = time.time() + timeout
    out = {}
    for name, box in boxes.items():
        box["thread"].join(max(0.0, deadline - time.time()))
        if "seconds" not in box:
            out[name] = ([], round(time.time() - box["t0"], 3), "no answer within %g s" % timeout)
            continue
        addrs = []
        for addr in box.get("addrs", []):
            if addr not in addrs:
                addrs.append(addr)
        out[name] = (addrs, box["seconds"], box.get("error", "" if addrs else "no address"))
    return out


def pick_address(addrs):
    """The address torch would use of a name's: IPv4 first (getaddrinfo's order otherwise)."""
    v4 = [a for a in addrs if ":" not in a]
    return (v4 or addrs or [None])[0]


def find(dest, system=None, resolve=lookup):
    """What the ranks of this host should use toward dest (rank 0's addr, a name or an IP):
    {"dest", "ifname" (None: none found), "why", "mtu", "addrs" (the chosen interface's), "interfaces",
    and for a name "name", "lookup_s"}; never raises."""
    system = system or System()
    out = {"dest": dest, "ifname": None}
    try:
        ip = dest
        if not is_ip(dest):
            found, seconds, error = resolve(dest)
            out.update(name=dest, lookup_s=seconds)
            ip = pick_address(found)
            if ip is None:
                out["why"] = "%s does not resolve here: %s" % (dest, error)
                out["interfaces"] = interfaces(system)
                return out
            out["dest"] = ip
        out["interfaces"] = ifaces = interfaces(system)
        ifname, why = _choose_here(ip, ifaces, system)
        chosen = next((i for i in ifaces if i["name"] == ifname), {})
        out.update(ifname=ifname, why=why, mtu=chosen.get("mtu"), addrs=chosen.get("addrs", []))
        if out.get("name"):
            out["why"] = "%s is %s; %s" % (dest, ip, why)
    except Exception as exc:  # never let this fail a push: the launch then leaves torch's default
        out["why"] = "could not look: %r" % (exc,)
    return out


def _choose_here(ip, ifaces, system):
    six = ":" in ip
    text = system.read("/proc/net/ipv6_route" if six else "/proc/net/route")
    routes = (parse_ipv6_route if six else parse_route)(text or "")
    addrs = [(i["name"], a) for i in ifaces for a in i["addrs"]]

    def route_get(dest):
        return system.run(["ip", "-o"] + (["-6"] if six else []) + ["route", "get", dest])

    return choose(ip, addrs, routes, route_get)
