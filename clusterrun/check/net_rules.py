"""The network and shared-folder rules of `clusterrun check` (pure: facts in, results out).

Why the interface rules look at the hostname: gloo binds to the address the host's own name resolves
to (ProcessGroupGloo's default device); a name that resolves to 127.0.1.1, as Debian's /etc/hosts
has it, makes every other host's connection fail. NCCL picks an interface by itself and may choose
the wrong one where there are several. With network.ifname auto (the default) or a name, clusterrun
sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, and both problems are worked around; with none they
stand.
"""

from __future__ import annotations

import ipaddress
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..plan import ifname_var, ranks_interface
from .rules import FAIL, OK, SKIP, WARN, CheckResult, disagreement

SLOW_LOOKUP_S = 1.0  # a name lookup slower than this: a dead or slow DNS server (each of torch's lookups waits)


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def connect_result(net: Mapping, master: str, port: Optional[int], rank0: str, *, skipped: str = "",
                   seen: Optional[bool] = None) -> CheckResult:
    """Did this host open a TCP connection to MASTER_ADDR:MASTER_PORT while rank 0's host listened there?

    `seen`: whether rank 0's listener saw this host (None: unknown), so a MASTER_ADDR that leads to
    some other machine with the port open does not pass.
    """
    where = f"{master}:{port}"
    if "resolve_error" in net:
        return CheckResult("connect", FAIL, f"cannot resolve MASTER_ADDR {master}: {net['resolve_error']}",
                           f"set addr: of {rank0} to an address every host can reach (an IP)", "no name")
    c = net.get("connect")
    if c is None:
        return CheckResult("connect", SKIP, skipped or "not tested", "", "·")
    data = dict(c)
    status = c.get("status")
    if status == "ok":
        if seen is False:
            return CheckResult("connect", WARN, f"connected to {where}, but {rank0}'s listener did not see this "
                                                "host: MASTER_ADDR may lead to another machine",
                               f"check addr: of {rank0}", "not seen", data)
        return CheckResult("connect", OK, f"{where} in {c.get('ms', 0):.1f} ms", "", f"{c.get('ms', 0):.1f} ms", data)
    if status == "timeout":
        return CheckResult("connect", FAIL, f"no answer from {where} within {c.get('seconds', 0):g} s while "
                                            f"{rank0} listened there: a firewall drops the packets",
                           f"allow TCP from this host to {rank0} (torch also opens connections on other ports: "
                           "allow all TCP between the hosts)", "timeout", data)
    if status == "refused":
        return CheckResult("connect", FAIL, f"{where} refused the connection although {rank0} listened there: "
                                            f"a firewall rejects it, or {master} is not {rank0}'s address",
                           f"check addr: of {rank0} and the firewall rules between the hosts", "refused", data)
    if status == "unreachable":
        return CheckResult("connect", FAIL, f"cannot reach {where}: {c.get('error')} (no route)",
                           f"fix the route from this host to {master}, or set addr: of {rank0} to an address on "
                           "a network both share", "no route", data)
    return CheckResult("connect", FAIL, f"connecting to {where} failed: {c.get('error')}", "", "error", data)


def _missing_ifnames(value: str, names: Sequence[str]) -> Sequence[str]:
    if value.startswith(("^", "=")):  # NCCL's exclude / exact-match syntax: not ours to second-guess
        return ()
    wanted = [v.strip() for v in value.split(",") if v.strip()]
    return [v for v in wanted if v not in names and not any(n.startswith(v) for n in names)]


def iface_result(net: Mapping, backend: str, env: Mapping[str, str], multi_host: bool,
                 mode: str = "none") -> CheckResult:
    """The address and interface this host uses toward the master, and the *_SOCKET_IFNAME it needs.
    mode: the host's network.ifname (auto: the interface net["choice"] found is what the ranks get)."""
    var = ifname_var(backend)
    ifaces = list(net.get("interfaces") or [])
    names = [i["name"] for i in ifaces]
    if "resolve_error" in net:
        return CheckResult("iface", SKIP, "MASTER_ADDR does not resolve here", "", "·")
    master_ip = net.get("master_ip", "?")
    if "route_error" in net:
        return CheckResult("iface", FAIL, f"no route to {master_ip}: {net['route_error']}",
                           f"fix the route to {master_ip} on this host", "no route")
    source = net.get("source", "?")
    iface = _source_iface(ifaces, source)
    data = {"source": source, "iface": iface, "master_ip": master_ip, "interfaces": ifaces,
            "hostname": net.get("hostname"), "hostname_addrs": net.get("hostname_addrs")}
    where = f"{source} via {iface} to {master_ip}"
    if multi_host and _loopback(master_ip):
        return CheckResult("iface", FAIL, f"MASTER_ADDR {master_ip} is a loopback address: other hosts cannot "
                                          "reach it", "set addr: of rank 0's host to its network address",
                           "loopback", data)
    if env.get(var):
        return _ifname_result(var, env[var], names, iface, where, data)
    fix = f"set env: {{{var}: {iface}}} for this host in the inventory"
    if mode != "none":
        set_by_us = _set_by_clusterrun(net, mode, names, iface, where, data)
        if set_by_us is not None:
            return _worked_around(set_by_us, net, ifaces, source, multi_host and backend != "nccl")
        fix = f"set network.ifname: {iface} for this host (hosts[i].network), or env: {{{var}: {iface}}}"
    if backend != "nccl" and multi_host:
        problem = _gloo_hostname_problem(net, ifaces, iface, source, fix, data)
        if problem is not None:
            return problem
    return _interfaces_result(ifaces, backend, iface, where, fix, data)


def _set_by_clusterrun(net: Mapping, mode: str, names: Sequence[str], iface: str, where: str,
                       data: dict) -> Optional[CheckResult]:
    """network.ifname auto or NAME: the interface the ranks get (None: auto found none, torch picks)."""
    if mode != "auto":
        if mode not in names and not any(n.startswith(mode) for n in names):
            return CheckResult("iface", FAIL, f"network.ifname is {mode}, but this host has no IPv4 interface "
                                              f"{mode} (it has {', '.join(names) or 'none'})",
                               f"set network.ifname: {iface} for this host (hosts[i].network), or auto",
                               "no " + mode, data)
        data["iface"] = mode
        if mode != iface:
            return CheckResult("iface", WARN, f"network.ifname {mode}, but traffic to the master leaves via {iface} "
                                              f"({where}): the others may not reach {mode}'s address",
                               "set network.ifname: auto (the interface toward rank 0's addr)", mode, data)
        return CheckResult("iface", OK, f"{where}; ranks get GLOO/NCCL_SOCKET_IFNAME={mode} (network.ifname)", "",
                           mode, data)
    choice = net.get("choice") or {}
    chosen = choice.get("ifname")
    data["choice"] = {k: choice.get(k) for k in ("ifname", "why", "mtu")}
    if not chosen:
        return None
    data["iface"] = chosen
    return CheckResult("iface", OK, f"{where}; ranks get GLOO/NCCL_SOCKET_IFNAME={chosen} (auto: "
                                    f"{choice.get('why', chosen)})", "", chosen, data)


def _worked_around(result: CheckResult, net: Mapping, ifaces: Sequence[Mapping], source: str,
                   gloo_across: bool) -> CheckResult:
    """A hostname problem that GLOO_SOCKET_IFNAME makes harmless: a note (and the lasting fix), not a failure."""
    if result.status != OK or not gloo_across:
        return result
    problem = _gloo_hostname_problem(net, ifaces, str(result.data.get("iface")), source, "", dict(result.data))
    if problem is None:
        return result
    note = problem.detail.split(": gloo")[0] if ": gloo" in problem.detail else problem.detail
    return CheckResult("iface", OK, f"{result.detail}. Note: {note}; gloo alone would go by that name, but "
                                    f"clusterrun sets GLOO_SOCKET_IFNAME={result.short}, so runs are fine",
                       f"map {net.get('hostname', 'the hostname')} to {source} in /etc/hosts for tools that do not "
                       "get the variable", result.short, {**result.data, "hostname_problem": problem.short})


def _source_iface(ifaces: Sequence[Mapping], source: str) -> str:
    """The interface that holds the source address of traffic to the master ("?": none of this host's)."""
    return next((i["name"] for i in ifaces if i["addr"] == source), "lo" if _loopback(source) else "?")


def _ifname_result(var: str, value: str, names: Sequence[str], iface: str, where: str, data: dict) -> CheckResult:
    """The env sets *_SOCKET_IFNAME: each interface it names must be one of this host's."""
    missing = _missing_ifnames(value, names)
    if missing:
        return CheckResult("iface", FAIL, f"{var}={value} but this host has no IPv4 interface "
                                          f"{', '.join(missing)} (it has {', '.join(names) or 'none'})",
                           f"set {var}={iface} in this host's env:", "bad ifname", data)
    return CheckResult("iface", OK, f"{where}; {var}={value}", "", iface, data)


def _gloo_hostname_problem(net: Mapping, ifaces: Sequence[Mapping], iface: str, source: str, fix: str,
                           data: dict) -> Optional[CheckResult]:
    """gloo binds to the address the hostname resolves to: it must be this host's own, on the interface that
    leads to the master (None: it is)."""
    addrs = [a for a in (net.get("hostname_addrs") or []) if ":" not in a]
    own = {i["addr"]: i["name"] for i in ifaces}
    hostname = net.get("hostname", "?")
    if "hostname_error" in net or not addrs:
        return CheckResult("iface", FAIL, f"hostname {hostname} does not resolve here "
                                          f"({net.get('hostname_error', 'no IPv4 address')}): gloo would fall "
                                          "back to loopback", fix, "hostname", data)
    if all(_loopback(a) for a in addrs):
        return CheckResult("iface", FAIL, f"hostname {hostname} resolves to {', '.join(addrs)}: gloo would "
                                          "bind to loopback and the other hosts cannot reach this one",
                           fix + f", or map {hostname} to {source} in /etc/hosts", "loopback name", data)
    bound = next((own[a] for a in addrs if a in own), None)
    if bound is None:
        return CheckResult("iface", FAIL, f"hostname {hostname} resolves to {', '.join(addrs)}, not an "
                                          "address of this host: gloo would fall back to loopback",
                           fix, "hostname", data)
    if bound != iface:
        return CheckResult("iface", WARN, f"gloo would use {bound} (the hostname's address), but traffic to "
                                          f"the master leaves via {iface}", fix, f"{bound}≠{iface}", data)
    return None


def _interfaces_result(ifaces: Sequence[Mapping], backend: str, iface: str, where: str, fix: str,
                       data: dict) -> CheckResult:
    """Several interfaces up: NCCL picks one by itself, maybe not the one toward the master."""
    several = [i["name"] for i in ifaces if i.get("up") and not _loopback(i["addr"])]
    if len(several) > 1:
        text = f"{where}; {len(several)} interfaces ({', '.join(several)})"
        if backend == "nccl":
            return CheckResult("iface", WARN, text + f": NCCL may pick another one than {iface}", fix, iface, data)
        return CheckResult("iface", OK, text, fix, iface, data)
    return CheckResult("iface", OK, where, "", iface, data)


def shared_result(init_method: str, shared_dir: Optional[str], rank0: str, *, is_rank0: bool,
                  written: Optional[Mapping], read: Optional[Mapping]) -> CheckResult:
    """For init_method file: rank 0's host wrote a token file in shared_dir; did this host see it?"""
    if init_method != "file":
        return CheckResult("shared", SKIP, f"init_method {init_method}: no shared folder needed", "", "·")
    fix = "mount one shared folder (NFS, CephFS, ...) at the same path on every host and set job.shared_dir to it"
    if written is None:
        return CheckResult("shared", SKIP, f"{rank0} was not checked", "", "·")
    if written.get("status") != "ok":
        if not is_rank0:
            return CheckResult("shared", SKIP, f"{rank0} could not write its test file", "", "·")
        return CheckResult("shared", FAIL, f"cannot write in {shared_dir}: {written.get('error')}", fix, "no write")
    if is_rank0:
        return CheckResult("shared", OK, f"wrote a test file in {shared_dir}", "", "wrote")
    if read is None:
        return CheckResult("shared", SKIP, "not read", "", "·")
    data = dict(read)
    if not read.get("dir_exists"):
        return CheckResult("shared", FAIL, f"{shared_dir} does not exist on this host", fix, "no folder", data)
    if read.get("status") == "missing":
        return CheckResult("shared", FAIL, f"{shared_dir} is not shared with {rank0}: the file {rank0} wrote there "
                                           "is not here", fix, "not shared", data)
    if read.get("status") != "ok":
        return CheckResult("shared", FAIL, f"{shared_dir}: the test file of {rank0} reads differently here "
                                           f"({read.get('error') or 'other content'})", fix, "differs", data)
    if not read.get("writable"):
        return CheckResult("shared", FAIL, f"{shared_dir} is shared but not writable here: torch's file store "
                                           "opens its file read-write on every rank",
                           f"make {shared_dir} writable for this user", "read-only", data)
    return CheckResult("shared", OK, f"sees {rank0}'s test file in {shared_dir}", "", "shared", data)


def relay_result(mode: str, chain: bool, next_host: Optional[str], next_addr: str, reach: Optional[Mapping],
                 seen: Optional[bool]) -> CheckResult:
    """Can this host open the relay push's connection to the next host of the chain (node order)?

    A host that cannot makes the push fall back to direct pushes from the controller: slower, never
    wrong, so the worst verdict is a warning. `seen`: whether the next host's listener saw this host.
    """
    if not chain:
        why = "push: {relay: false}: every host gets its push directly" if mode == "false" else \
            "too few hosts for a relay push: every host gets its push directly"
        return CheckResult("relay", SKIP, why, "", "·")
    if next_host is None:
        return CheckResult("relay", SKIP, "last host of the relay chain: it passes nothing on", "", "·")
    if reach is None:
        return CheckResult("relay", SKIP, f"not tested: {next_host} did not listen", "", "·")
    data = dict(reach)
    fallback = f"relay pushes to {next_host} and the hosts after it fall back to direct pushes (slower)"
    hint = f"allow TCP from this host to {next_host} on ephemeral ports, or set push: {{relay: false}}"
    status = reach.get("status")
    if status == "ok":
        if seen is False:
            return CheckResult("relay", WARN, f"connected to {next_addr}, but {next_host}'s listener did not see this "
                                              f"host: {next_addr} may lead to another machine; " + fallback,
                               f"check addr: of {next_host}", "not seen", data)
        return CheckResult("relay", OK, f"→ {next_host} ({next_addr}) in {reach.get('ms', 0):.1f} ms", "",
                           f"{reach.get('ms', 0):.1f} ms", data)
    what = {"timeout": f"no answer within {reach.get('seconds', 0):g} s (a firewall drops the packets)",
            "refused": "connection refused (a firewall rejects it)",
            "unreachable": f"no route ({reach.get('error')})"}.get(status, f"failed: {reach.get('error')}")
    return CheckResult("relay", WARN, f"cannot connect to {next_host} ({next_addr}): {what}; " + fallback, hint,
                       status or "error", data)


def addr_result(net: Mapping, addr: str, explicit: bool, connection: str) -> CheckResult:
    """The host's addr: (what MASTER_ADDR and the peers' connections use) must be one of its own addresses.
    explicit: the inventory sets addr: (else it is the ssh host:)."""
    own = net.get("own") or {}
    held = _held_addresses(net)
    ips = own.get("ips") or []
    data = {"addr": addr, "ips": ips, "interfaces": sorted(held)}
    if not held:
        return CheckResult("addr", SKIP, "this host's addresses could not be read", "", "·", data)
    on = next(((ip, held[ip]) for ip in ips if ip in held), None)
    if on is not None:
        shown = addr if addr == on[0] else f"{addr} ({on[0]})"
        return CheckResult("addr", OK, f"{shown} is on {on[1]}", "", on[1], data)
    key = "addr:" if explicit else "host: (there is no addr:)"
    if not ips:
        return CheckResult("addr", WARN, f"{addr} ({key}) does not resolve on this host: "
                                         f"{own.get('error') or 'no address'}",
                           "set addr: to this host's IP address on the network the hosts share", "no name", data)
    return _addr_elsewhere(addr, key, held, data, fail=explicit and connection != "local")


def _held_addresses(net: Mapping) -> Dict[str, str]:
    """address → the interface of this host that holds it."""
    return {a: i["name"] for i in (net.get("choice") or {}).get("interfaces") or () for a in i.get("addrs") or ()}


def _addr_elsewhere(addr: str, key: str, held: Mapping[str, str], data: dict, fail: bool) -> CheckResult:
    others = ", ".join(f"{n} {a}" for a, n in sorted(held.items(), key=lambda kv: kv[1]) if n != "lo")
    detail = (f"{addr} ({key}) is not an address of this host (it has {others or 'none'}): the other hosts' "
              "connections to it go elsewhere (NAT?), and torch binds to this host's own addresses")
    return CheckResult("addr", FAIL if fail else WARN, detail, "set addr: to the address the other hosts reach this "
                                                               "one by", "not here", data)


def dns_result(net: Mapping) -> CheckResult:
    """The name lookups a run makes here (the host's own name; rank 0's addr and this host's when they are
    names), timed: over SLOW_LOOKUP_S means a dead or slow DNS server, and every lookup torch makes waits."""
    lookups = list(net.get("lookups") or ())
    if not lookups:
        return CheckResult("dns", SKIP, "no lookup timed", "", "·")
    data = {"lookups": lookups}
    slow = [x for x in lookups if x.get("seconds", 0) > SLOW_LOOKUP_S or "no answer" in (x.get("error") or "")]
    text = "; ".join(f"{x['what']} {x['name']} in {x.get('seconds', 0) * 1000:.0f} ms" for x in lookups)
    if slow:
        what = "; ".join(f"looking up {x['what']} {x['name']} took {x.get('seconds', 0):.1f} s"
                         + (f" ({x['error']})" if x.get("error") else "") for x in slow)
        return CheckResult("dns", WARN, f"{what}: a dead or slow DNS server (every lookup torch makes waits "
                                        "as long; rendezvous may time out)",
                           "fix the servers in /etc/resolv.conf, or put the hosts' names in /etc/hosts",
                           f"{max(x.get('seconds', 0) for x in slow):.1f} s", data)
    worst = max(x.get("seconds", 0) for x in lookups)
    return CheckResult("dns", OK, text, "", f"{worst * 1000:.0f} ms", data)


def mtu_results(used: Mapping[str, tuple]) -> Tuple[Dict[str, CheckResult], List[str]]:
    """{host: mtu result} from (interface, MTU) each host's ranks use: the hosts must agree (a host with
    a larger MTU sends frames the others drop, and collectives stall)."""
    known = {h: (i, m) for h, (i, m) in used.items() if m}
    odd, note = disagreement("MTU", {h: str(m) for h, (_, m) in known.items()})
    out = {}
    for host, (iface, mtu) in used.items():
        data = {"iface": iface, "mtu": mtu}
        if not mtu:
            out[host] = CheckResult("mtu", SKIP, f"MTU of {iface or 'the interface'} not known", "", "·", data)
        elif host in odd:
            out[host] = CheckResult("mtu", WARN, f"{odd[host]} (on {iface})",
                                    f"set the same MTU on every host (ip link set dev {iface} mtu N)", str(mtu), data)
        else:
            out[host] = CheckResult("mtu", OK, f"{mtu} on {iface}", "", str(mtu), data)
    return out, [note] if note else []


def used_interface(net: Mapping, mode: str, env: Mapping[str, str], backend: str) -> tuple:
    """(interface, MTU) the ranks of this host use toward the master (for mtu_results), from the probe's
    facts: plan.ranks_interface, as a launch derives it, the kernel's route the last resort."""
    routed = _source_iface(net.get("interfaces") or (), net.get("source", "?"))
    return ranks_interface(mode, env, net.get("choice"), backend, routed)


def active_ib(ib: Sequence[Mapping]) -> List[str]:
    """`mlx5_0 port 1 (InfiniBand, 200 Gb/sec (4X HDR))` of every port whose state is ACTIVE."""
    return [f"{d['device']} port {p.get('port')} ({p.get('link_layer') or '?'}, {p.get('rate') or '?'})"
            for d in ib for p in d.get("ports") or () if "ACTIVE" in (p.get("state") or "")]


def ib_notes(facts: Mapping[str, Mapping], backend: str, hosts: Sequence) -> List[str]:
    """What check says of InfiniBand/RoCE: the devices per host, and a warning where the hosts have them
    but the run would use TCP (gloo; or NCCL_IB_DISABLE=1), the "silently fell back to TCP" case.
    hosts: the inventory's (their env:)."""
    envs = {h.name: h.env for h in hosts}
    found = {h: active_ib(f.get("ib") or ()) for h, f in facts.items()}
    found = {h: ports for h, ports in found.items() if ports}
    if not found:
        return []
    where = "; ".join(f"{h}: {', '.join(p)}" for h, p in found.items())
    disabled = [h for h in found if str((envs.get(h) or {}).get("NCCL_IB_DISABLE", "")) not in ("", "0")]
    if backend != "nccl":
        return [f"InfiniBand/RoCE on {where}, but backend {backend} always talks TCP: backend: nccl uses them "
                "(NCCL_IB_HCA picks the devices)"]
    if disabled:
        return [f"InfiniBand/RoCE on {where}, but NCCL_IB_DISABLE is set in the env of {', '.join(disabled)}: "
                "NCCL falls back to TCP there; remove it (NCCL_IB_HCA picks the devices)"]
    return [f"InfiniBand/RoCE on {where}: NCCL should use them; NCCL_DEBUG=INFO shows `NET/IB : Using` "
            "(`NET/Socket` means it fell back to TCP: check rdma-core and NCCL_IB_HCA)"]
