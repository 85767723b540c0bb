"""The host program's interface choice (remote/host/net/ifaces.py) on canned kernel tables: several NICs,
docker0, a default route, metrics, a blackhole, IPv6 only, `addr` a name, and `ip` as the fallback
where /proc and /sys cannot be read."""

import socket
import time

from clusterrun.remote.host.net import ifaces

# A host with a default route on eth0, the cluster's network on eth1, docker0, an InfiniBand subnet reached
# over two interfaces (the lower metric wins) and a blackhole, as /proc/net/route prints them (little-endian).
ROUTE = """\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0
eth1\t0000010A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
ib0\t0007010A\t00000000\t0001\t0\t0\t50\t00FFFFFF\t0\t0\t0
eth1\t0007010A\t00000000\t0001\t0\t0\t200\t00FFFFFF\t0\t0\t0
*\t000012C6\t00000000\t0001\t0\t0\t0\t0000FEFF\t0\t0\t0
eth9\t0000000B\t00000000\t0000\t0\t0\t0\t000000FF\t0\t0\t0
"""

IF_INET6 = """\
00000000000000000000000000000001 01 80 10 80       lo
20010db8000100000000000000000011 02 40 00 80     eth0
fe800000000000000000000000000011 02 40 20 80     eth0
"""

# IPv6 only: the subnet on eth0, a default route via a link-local router, the host's own address on lo
# (the local table shows through), the kernel's reject route on lo
IPV6_ROUTE = """\
20010db8000100000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth0
20010db8000100000000000000000011 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
"""

IP_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth0    inet 192.168.1.11/24 brd 192.168.1.255 scope global eth0\\       valid_lft forever preferred_lft forever
3: eth1@if7    inet 10.1.0.11/16 brd 10.1.255.255 scope global eth1\\       valid_lft forever preferred_lft forever
3: eth1@if7    inet6 fe80::11/64 scope link \\       valid_lft forever preferred_lft forever
"""


class Canned:
    """What ifaces.System reads, from canned text (None: the file cannot be read)."""

    def __init__(self, files=None, v4=None, mtu=None, commands=None):
        self.files = dict(files or {})
        self.v4 = dict(v4 or {})
        self.mtu = dict(mtu or {})
        self.commands = dict(commands or {})
        self.ran = []
        for name, value in self.mtu.items():
            self.files[f"/sys/class/net/{name}/mtu"] = f"{value}\n"
            self.files[f"/sys/class/net/{name}/operstate"] = "unknown\n" if name == "lo" else "up\n"

    def read(self, path):
        return self.files.get(path)

    def names(self):
        return sorted(self.mtu)

    def ipv4(self, name):
        return self.v4.get(name)

    def run(self, argv):
        self.ran.append(argv)
        return self.commands.get(" ".join(argv), "")


def several_nics():
    return Canned({"/proc/net/route": ROUTE, "/proc/net/if_inet6": IF_INET6},
                  v4={"lo": "127.0.0.1", "eth0": "192.168.1.11", "eth1": "10.1.0.11", "docker0": "172.17.0.1",
                      "ib0": "10.1.7.11"},
                  mtu={"lo": 65536, "eth0": 1500, "eth1": 9000, "docker0": 1500, "ib0": 2044})


def test_the_route_table_is_read_as_the_kernel_writes_it():
    routes = ifaces.parse_route(ROUTE)
    assert routes[0] == {"iface": "eth0", "net": "0.0.0.0", "prefix": 0, "gateway": "192.168.1.1", "metric": 100}
    assert {"iface": "eth1", "net": "10.1.0.0", "prefix": 16, "gateway": "", "metric": 0} in routes
    assert {"iface": None, "net": "198.18.0.0", "prefix": 15, "gateway": "", "metric": 0} in routes  # blackhole
    assert all(r["iface"] != "eth9" for r in routes)  # a route that is not up is not a route


def test_the_longest_prefix_wins_over_docker0_and_the_default_route():
    found = ifaces.find("10.1.0.10", several_nics())
    assert found["ifname"] == "eth1" and found["mtu"] == 9000 and found["addrs"] == ["10.1.0.11"]
    assert found["why"] == "eth1 carries the route 10.1.0.0/16 to 10.1.0.10"
    assert ifaces.find("172.17.0.5", several_nics())["ifname"] == "docker0"
    default = ifaces.find("203.0.113.7", several_nics())
    assert default["ifname"] == "eth0" and default["why"] == "eth0 carries the default route via 192.168.1.1 to " \
                                                             "203.0.113.7"


def test_between_routes_of_one_prefix_the_lower_metric_wins():
    assert ifaces.find("10.1.7.20", several_nics())["ifname"] == "ib0"


def test_rank_0s_own_host_takes_the_interface_that_holds_the_address():
    found = ifaces.find("10.1.0.11", several_nics())
    assert (found["ifname"], found["why"]) == ("eth1", "eth1 holds 10.1.0.11 itself")
    assert ifaces.find("127.0.0.1", several_nics())["ifname"] == "lo"


def test_a_blackhole_or_no_route_is_no_interface():
    hole = ifaces.find("198.18.3.3", several_nics())
    assert hole["ifname"] is None and "blackhole" in hole["why"]
    bare = Canned({"/proc/net/route": ROUTE.splitlines()[0] + "\n"}, v4={"eth0": "192.168.1.11"}, mtu={"eth0": 1500})
    assert ifaces.find("10.9.9.9", bare) == {**ifaces.find("10.9.9.9", bare), "ifname": None,
                                             "why": "no route to 10.9.9.9"}


def test_ipv6_only():
    system = Canned({"/proc/net/ipv6_route": IPV6_ROUTE, "/proc/net/if_inet6": IF_INET6, "/proc/net/route": ""},
                    mtu={"lo": 65536, "eth0": 1500})
    peer = ifaces.find("2001:db8:1::10", system)
    assert (peer["ifname"], peer["why"]) == ("eth0", "eth0 carries the route 2001:db8:1::/64 to 2001:db8:1::10")
    assert peer["addrs"] == ["2001:db8:1::11", "fe80::11"]
    assert ifaces.find("2001:db8:1::11", system)["why"] == "eth0 holds 2001:db8:1::11 itself"
    far = ifaces.find("2001:db8:9::1", system)
    assert (far["ifname"], far["why"]) == ("eth0", "eth0 carries the default route via fe80::1 to 2001:db8:9::1")
    routes = ifaces.parse_ipv6_route(IPV6_ROUTE)
    assert not any(r["prefix"] == 0 and r["iface"] == "lo" for r in routes)  # the kernel's reject route: not up


def test_addr_a_name_is_looked_up_first():
    asked = []

    def resolve(name):
        asked.append(name)
        return ["2001:db8::5", "10.1.0.10"], 0.004, ""

    found = ifaces.find("node0", several_nics(), resolve=resolve)
    assert asked == ["node0"] and found["dest"] == "10.1.0.10"  # IPv4 first, as torch's lookups go
    assert found["ifname"] == "eth1" and found["why"].startswith("node0 is 10.1.0.10; eth1 carries")
    nowhere = ifaces.find("node9", several_nics(), resolve=lambda name: ([], 2.0, "no answer within 2 s"))
    assert nowhere["ifname"] is None and nowhere["why"] == "node9 does not resolve here: no answer within 2 s"


def test_ip_is_the_fallback_where_proc_and_sys_say_nothing():
    system = Canned(commands={"ip -o addr show": IP_ADDR,
                              "ip -o route get 10.1.0.10": "10.1.0.10 dev eth1 src 10.1.0.11 uid 1000 \\    cache"})
    found = ifaces.find("10.1.0.10", system)
    assert (found["ifname"], found["why"]) == ("eth1", "eth1 carries the route to 10.1.0.10 (ip route get)")
    names = {i["name"]: i["addrs"] for i in found["interfaces"]}
    assert names == {"lo": ["127.0.0.1"], "eth0": ["192.168.1.11"], "eth1": ["10.1.0.11", "fe80::11"]}
    assert ifaces.find("10.1.0.11", system)["why"] == "eth1 holds 10.1.0.11 itself"
    assert ["ip", "-o", "route", "get", "10.1.0.11"] not in system.ran  # held: no need to ask


def test_ip_is_not_asked_when_the_proc_tables_answer():
    system = several_nics()
    ifaces.find("10.1.0.10", system)
    assert system.ran == []


def test_a_broken_source_never_fails_the_push():
    class Broken(Canned):
        def names(self):
            raise RuntimeError("boom")

    found = ifaces.find("10.1.0.10", Broken())
    assert found["ifname"] is None and "boom" in found["why"]


def test_lookups_give_up_at_their_timeout(monkeypatch):
    def dead_dns(*args, **kwargs):
        time.sleep(5)
        raise socket.gaierror("too late")

    monkeypatch.setattr(ifaces.socket, "getaddrinfo", dead_dns)
    t0 = time.monotonic()
    found = ifaces.lookup_many(["a.example", "b.example"], timeout=0.3)
    assert time.monotonic() - t0 < 3  # both at once, neither waited for
    assert found["a.example"][0] == [] and found["a.example"][2] == "no answer within 0.3 s"


def test_the_real_tables_of_this_machine_name_an_interface_for_loopback():
    found = ifaces.find("127.0.0.1")
    assert found["ifname"] == "lo" and any(i["name"] == "lo" for i in found["interfaces"])
