"""The records of `clusterrun check` and the pure rules that turn what a host said into results.

No I/O here: check.py gathers facts (SSH, the probe, the listener), these functions judge them, so
every verdict and every hint is unit-testable with plain dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import EXIT_CONNECT, EXIT_FAILED, EXIT_OK, AuthError, HostError, HostKeyChanged, HostKeyUnknown
from ..config.environment import FINGERPRINT_FIELDS, mismatches
from ..config.sizes import size_text

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
CHECKS = ("ssh", "python", "torch", "cuda", "gpu", "stack", "port", "connect", "iface", "addr", "dns", "mtu", "disk", "shared", "relay",
          "clock")
SKEW_WARN_S = 1.0  # log lines of different hosts no longer line up, nor do root-cause times
SKEW_FAIL_S = 30.0  # beyond what TLS and Kerberos tolerate; timestamps across hosts are meaningless
DISK_SPARE = 1 << 30  # room for logs and checkpoints beside the push, before we call it tight


@dataclass(frozen=True)
class CheckResult:
    name: str  # one of CHECKS
    status: str  # ok | warn | fail | skip
    detail: str  # one line: what was found
    hint: str = ""  # one line: how to fix it
    short: str = ""  # the table cell
    data: Mapping[str, object] = field(default_factory=dict)  # measured values, for --json

    def to_json(self) -> dict:
        return {"status": self.status, "detail": self.detail, "hint": self.hint, "data": dict(self.data)}


@dataclass(frozen=True)
class HostReport:
    host: str
    node_rank: int
    results: Tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.status != FAIL for r in self.results)

    def get(self, name: str) -> Optional[CheckResult]:
        return next((r for r in self.results if r.name == name), None)


@dataclass(frozen=True)
class Report:
    hosts: Tuple[HostReport, ...]
    master_addr: str
    master_port: Optional[int]  # what was checked (the free one found, for `auto`)
    seconds: float = 0.0
    notes: Tuple[str, ...] = ()  # findings across hosts, e.g. which hosts have which torch

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    @property
    def exit_code(self) -> int:
        """0 when nothing failed; 3 when every failure is a host that could not be reached (as for a
        launch); else 1 (a port in use, torch missing, a firewall, ...)."""
        failed = [h for h in self.hosts if not h.ok]
        if not failed:
            return EXIT_OK
        unreachable = all((h.get("ssh") or CheckResult("ssh", OK, "")).status == FAIL for h in failed)
        return EXIT_CONNECT if unreachable else EXIT_FAILED

    def to_json(self) -> dict:
        return {"ok": self.ok, "exit_code": self.exit_code, "seconds": round(self.seconds, 3),
                "master": {"addr": self.master_addr, "port": self.master_port}, "checks": list(CHECKS),
                "notes": list(self.notes),
                "hosts": [{"host": h.host, "node_rank": h.node_rank, "ok": h.ok,
                           "checks": {r.name: r.to_json() for r in h.results}} for h in self.hosts]}


@dataclass(frozen=True)
class CheckProblem:
    """One warning or failure of launch's preflight, for the runner to report or raise."""

    host: str
    node_rank: int
    check: str
    status: str  # warn | fail
    detail: str
    hint: str = ""


def hosts_text(names: Sequence[str]) -> str:
    return ", ".join(names)


# ------------------------------------------------------------------ ssh and python


def ssh_failed(exc: HostError) -> CheckResult:
    """A connection error as the ssh check, saying what the host-key policy means where it decided."""
    if isinstance(exc, HostKeyChanged):
        short, why = "key changed", "fatal under every policy: someone may be intercepting, or the host was reinstalled"
    elif isinstance(exc, HostKeyUnknown):
        short, why = "key unknown", "policy strict refuses hosts not in known_hosts (accept-new would record it)"
    elif isinstance(exc, AuthError):
        short, why = "auth", ""
    else:
        short, why = "unreachable", ""
    detail = f"{exc.reason}: {exc.message}" + (f" [{why}]" if why else "")
    return CheckResult("ssh", FAIL, detail, exc.hint, short, {"reason": exc.reason})


def shell_noise(junk: str) -> Optional[CheckResult]:
    """Text before the probe's first line: a login shell that prints on every command breaks framed output."""
    if not junk.strip():
        return None
    first = junk.strip().splitlines()[0][:60]
    return CheckResult("ssh", FAIL, f"the login shell prints {first!r} before every command's output; "
                                    "clusterrun's push and log protocols break on it",
                       "print only in interactive shells: `[ -z \"$PS1\" ] && return` at the top of ~/.bashrc",
                       "shell noise", {"noise": junk[:500]})


def probe_failed(python: str, exit_code: Optional[int], stderr: str) -> CheckResult:
    tail = " / ".join(stderr.strip().splitlines()[-2:])[:300]
    if exit_code == 127 or "not found" in stderr or "No such file" in stderr:
        return CheckResult("python", FAIL, f"no Python at {python} (exit {exit_code}): {tail}",
                           "install Python 3 there, or set python: in the inventory to one that exists", "missing")
    if "SyntaxError" in stderr:
        return CheckResult("python", FAIL, f"{python} is too old to run clusterrun's probe: {tail}",
                           "use Python 3.8 or newer (set python: in the inventory)", "too old")
    return CheckResult("python", FAIL, f"{python} failed (exit {exit_code}): {tail}", "", "error")


def group_versions(values: Mapping[str, Optional[str]]) -> List[Tuple[str, List[str]]]:
    """Hosts grouped by value (None left out), largest group first; ties keep the hosts' order."""
    groups: Dict[str, List[str]] = {}
    for host, value in values.items():
        if value is not None:
            groups.setdefault(value, []).append(host)
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


def disagreement(what: str, values: Mapping[str, Optional[str]]) -> Tuple[Dict[str, str], Optional[str]]:
    """({host: why it is the odd one out}, a note naming every group) when hosts differ, else ({}, None).

    The largest group is taken as intended; on a tie there is no majority and every host is named.
    """
    groups = group_versions(values)
    if len(groups) < 2:
        return {}, None
    note = f"{what} differs between hosts: " + "; ".join(f"{v} on {hosts_text(h)}" for v, h in groups)
    majority = groups[0] if len(groups[0][1]) > len(groups[1][1]) else None
    odd: Dict[str, str] = {}
    for value, hosts in groups:
        if majority is not None and value == majority[0]:
            continue
        others = [f"{v} on {hosts_text(h)}" for v, h in groups if v != value]
        for host in hosts:
            odd[host] = f"{what} {value} here, but {'; '.join(others)}"
    return odd, note


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def python_results(facts: Mapping[str, Mapping]) -> Tuple[Dict[str, CheckResult], List[str]]:
    """{host: python result} for the hosts whose probe ran; hosts must agree on major.minor."""
    odd, note = disagreement("Python", {h: minor(f["python"]) for h, f in facts.items()})
    out = {}
    for host, f in facts.items():
        detail = f"{f['python']} ({f['executable']})"
        if host in odd:
            out[host] = CheckResult("python", FAIL, odd[host] + f" ({f['executable']})",
                                    "use the same Python minor version on every host (pickled objects and "
                                    "torch builds differ between them)", f"{minor(f['python'])} differs",
                                    {"version": f["python"], "executable": f["executable"]})
        else:
            out[host] = CheckResult("python", OK, detail, "", f["python"],
                                    {"version": f["python"], "executable": f["executable"]})
    return out, [note] if note else []


def stack_results(prints: Mapping[str, Mapping], allowed: Sequence[str] = ()) -> Dict[str, CheckResult]:
    """{host: stack result}: the stack fingerprint (Python, torch, CUDA, NCCL, cuDNN, driver) of every
    host whose probe read it, each difference named as a launch would refuse it (allowed: accepted)."""
    odd: Dict[str, List[str]] = {}
    for m in mismatches({h: p for h, p in prints.items() if "error" not in p}, allowed):
        common = m.values[0][0]
        for value, hosts in m.values[1:]:
            for host in hosts:
                odd.setdefault(host, []).append(f"{m.field} {value}, the others {common}")
    out = {}
    for host, fp in prints.items():
        if "error" in fp:
            out[host] = CheckResult("stack", WARN, f"the fingerprint could not be read: {fp['error']}", "", "?")
            continue
        detail = ", ".join(f"{f} {fp.get(f) or '-'}" for f in FINGERPRINT_FIELDS)
        if host in odd:
            out[host] = CheckResult("stack", FAIL, "; ".join(odd[host]) + f" ({detail})",
                                    "a launch refuses this (exit 2): install the same versions on every host, give "
                                    "the job a job.environment, or accept it with job.environment.allow_mismatch",
                                    ", ".join(t.split(",")[0] for t in odd[host]), dict(fp))
        else:
            out[host] = CheckResult("stack", OK, detail, "", "same", dict(fp))
    return out


# ------------------------------------------------------------------ torch and cuda


def torch_results(torch: Mapping[str, Mapping], pythons: Mapping[str, str]) -> Tuple[Dict[str, CheckResult], List[str]]:
    """{host: torch result}: it imports, and every host has the same torch (torchvision: a warning)."""
    good = {h: t for h, t in torch.items() if "version" in t}
    odd, note = disagreement("torch", {h: t["version"].split("+")[0] for h, t in good.items()})
    # the same release in different builds (+cpu, +cu121): only worth a warning, and only once releases agree
    builds, build_note = disagreement("torch build", {} if odd else {h: t["version"] for h, t in good.items()})
    vision, vision_note = disagreement("torchvision", {h: t.get("torchvision") or "none" for h, t in good.items()})
    wanted = group_versions({h: t["version"] for h, t in good.items()})
    want = f"torch {wanted[0][0]}" if wanted else "torch"
    out = {host: _torch_result(t, pythons.get(host, "python"), want, odd=odd.get(host), build=builds.get(host),
                               vision=vision.get(host)) for host, t in torch.items()}
    return out, [n for n in (note, build_note, vision_note) if n]


def _torch_result(t: Mapping, python: str, want: str, *, odd: Optional[str], build: Optional[str],
                  vision: Optional[str]) -> CheckResult:
    """One host's torch result; odd, build, vision: how its release, build and torchvision differ from the
    other hosts' (None: they do not)."""
    data = {k: t.get(k) for k in ("version", "torchvision", "cuda_build", "seconds") if k in t}
    if "version" not in t:
        return CheckResult("torch", FAIL, f"torch does not import with {python}: {t.get('error', 'unknown error')}",
                           f"install {want} for that Python, or set python: to the interpreter that has it",
                           "missing", data)
    detail = _torch_detail(t)
    if odd is not None:
        return CheckResult("torch", FAIL, odd, f"install the same torch on every host ({want})", t["version"], data)
    if build is not None or vision is not None or t.get("torchvision_error"):
        why = build or vision or detail
        return CheckResult("torch", WARN, why, "install the same builds everywhere (fine for gloo on CPU; "
                                               "nccl needs a CUDA build on every host)", t["version"], data)
    return CheckResult("torch", OK, detail, "", t["version"], data)


def _torch_detail(t: Mapping) -> str:
    """'2.3.1, torchvision 0.18.1', and the error where torchvision is installed but does not import."""
    vis = t.get("torchvision") or ("broken" if t.get("torchvision_error") else "none")
    return f"{t['version']}, torchvision {vis}" + (f" ({t['torchvision_error']})" if t.get("torchvision_error") else "")


def cuda_result(backend: str, slots: int, t: Mapping) -> CheckResult:
    devices = int(t.get("devices") or 0)
    data = {k: t.get(k) for k in ("cuda", "devices", "device_names", "nccl", "nccl_version", "cuda_build")}
    have = f"{devices} GPU{'s' if devices != 1 else ''}" + (
        f" ({t['device_names'][0]})" if t.get("device_names") else "")
    if backend != "nccl":
        return CheckResult("cuda", SKIP, f"backend {backend}; CUDA: {have if t.get('cuda') else 'none'}", "",
                           "gloo", data)
    if not t.get("cuda"):
        why = t.get("cuda_error") or (f"torch {t.get('version')} is a CPU build" if not t.get("cuda_build")
                                      else "no usable GPU or driver")
        return CheckResult("cuda", FAIL, f"backend nccl but CUDA is not available: {why}",
                           "install a CUDA build of torch and the NVIDIA driver, or use backend: gloo", "no CUDA", data)
    if not t.get("nccl"):
        return CheckResult("cuda", FAIL, "backend nccl but this torch has no NCCL", "use a torch build with NCCL, "
                                                                                      "or backend: gloo", "no NCCL", data)
    if devices < slots:
        return CheckResult("cuda", FAIL, f"slots: {slots} but only {have} visible (one GPU per rank with nccl)",
                           f"set slots: {devices} for this host, or check CUDA_VISIBLE_DEVICES in its env", "too few",
                           data)
    return CheckResult("cuda", OK, f"{have} for {slots} slot{'s' if slots != 1 else ''}, NCCL "
                                   f"{t.get('nccl_version', '?')}", "", f"{devices} GPU", data)


# ------------------------------------------------------------------ clock and disk


def clock_skew(sent: float, host_time: float, received: float) -> Tuple[float, float]:
    """(skew, uncertainty): the host's clock minus ours, taking its reading at the midpoint of the round trip."""
    return host_time - (sent + received) / 2, (received - sent) / 2


def clock_result(sent: float, host_time: float, received: float) -> CheckResult:
    skew, err = clock_skew(sent, host_time, received)
    surely = max(0.0, abs(skew) - err)  # a slow round trip must not pass for skew
    side = "ahead of" if skew > 0 else "behind"
    data = {"skew_s": round(skew, 4), "uncertainty_s": round(err, 4)}
    if surely > SKEW_FAIL_S:
        return CheckResult("clock", FAIL, f"{abs(skew):.1f} s {side} this machine (±{err:.3f} s): log times across "
                                          "hosts are meaningless, and TLS/Kerberos fail beyond such skew",
                           "run NTP (chrony or systemd-timesyncd) on every host", f"{skew:+.0f} s", data)
    if surely > SKEW_WARN_S:
        return CheckResult("clock", WARN, f"{abs(skew):.2f} s {side} this machine (±{err:.3f} s): log lines and "
                                          "root-cause times of different hosts will not line up",
                           "run NTP (chrony or systemd-timesyncd) on every host", f"{skew:+.1f} s", data)
    if surely == 0:  # the reading cannot tell the clocks apart: say how closely it looked
        return CheckResult("clock", OK, f"within ±{err * 1000:.0f} ms of this machine", "", f"±{err * 1000:.0f} ms",
                           data)
    return CheckResult("clock", OK, f"{abs(skew) * 1000:.0f} ms {side} this machine (±{err * 1000:.0f} ms)", "",
                       f"{skew * 1000:+.0f} ms", data)


def disk_result(disk: Mapping, push_bytes: Optional[int], push_error: str = "") -> CheckResult:
    if "error" in disk:
        return CheckResult("disk", FAIL, f"cannot look at {disk['path']}: {disk['error']}", "", "error")
    free = int(disk["free"])
    data = {"free": free, "push_bytes": push_bytes, "path": disk["path"], "total": disk.get("total"),
            "usage": disk.get("usage")}
    where = disk["path"] if disk.get("exists") else f"{disk['checked']} (for {disk['path']})"
    if not disk.get("writable"):
        return CheckResult("disk", FAIL, f"{where} is not writable", "point workdir: at a folder this user owns",
                           "read-only", data)
    if push_bytes is None:
        why = f"push size unknown: {push_error}" if push_error else "no job script: push size not known"
        return CheckResult("disk", WARN if push_error else OK, f"{size_text(free)} free in {where}{kept_text(disk)}; {why}", "",
                           size_text(free), data)
    text = f"{size_text(free)} free in {where}{kept_text(disk)}, the push is {size_text(push_bytes)}"
    total = int(disk.get("total") or 0)
    if free < push_bytes:
        return CheckResult("disk", FAIL, text, "free space there, or set workdir: to a bigger disk", "full", data)
    hint = "`clusterrun clean INVENTORY --keep N --cache` removes old runs there (docs/operations.md), " \
        "or set workdir: to a bigger disk"
    if free < push_bytes * 2 + DISK_SPARE:
        return CheckResult("disk", WARN, text + ": little room left for logs and checkpoints", hint, size_text(free),
                           data)
    if total and free < total * 0.10:
        return CheckResult("disk", WARN, text + f": under 10% of {size_text(total)} free", hint, size_text(free), data)
    return CheckResult("disk", OK, text, "", size_text(free), data)


def kept_text(disk: Mapping) -> str:
    """" (runs: 12 using 1.2 GB, cache 3.4 GB)" from the probe's workdir usage, "" when unknown."""
    usage = disk.get("usage") or {}
    if not usage or not (usage.get("runs") or usage.get("cache_bytes")):
        return ""
    return (f" (runs: {usage.get('runs', 0)} using {size_text(usage.get('runs_bytes', 0))}, "
            f"cache {size_text(usage.get('cache_bytes', 0))})")


def port_text(port: Mapping, wanted: Optional[int], host: str) -> CheckResult:
    """Rank 0's master port, from the listener's bind (check) or the push's (launch's preflight)."""
    data = {"port": port.get("port", wanted), "auto": wanted is None}
    if port.get("free"):
        label = f"auto: {port['port']} is free" if wanted is None else f"{port['port']} is free"
        return CheckResult("port", OK, f"{label} on {host}", "", str(port["port"]), data)
    holder = port.get("holder") or {}
    taken = "EADDRINUSE" in port.get("error", "")
    detail = (f"master port {wanted} is in use on {host}" + holder_text(holder)) if taken else \
        f"cannot bind master port {wanted} on {host}: {port.get('error')}"
    hint = "stop what holds it, or set master: {port: auto} (or another port)"
    if holder.get("run_id"):
        hint = (f"`clusterrun stop {holder['run_id']}` if that run should end; to run both, give this one "
                "another port: master: {port: auto}")
    return CheckResult("port", FAIL, detail, hint, "in use" if taken else "error", {**data, "holder": holder})


def holder_text(holder: Mapping) -> str:
    """" by clusterrun run R (rank 0; pid 123 python train.py, user cr)", or " (pid …, user …)", or ""."""
    who = ", ".join(x for x in (f"pid {holder['pid']} {holder.get('command', '')[:60]}".strip() if holder.get("pid")
                                else "", f"user {holder['user']}" if holder.get("user") else "") if x)
    if holder.get("run_id"):
        rank = f"rank {holder['rank']}" if holder.get("rank") is not None else "a rank"
        how = "starting: it listens there once its Python is up" if holder.get("starting") else who
        return f" by clusterrun run {holder['run_id']} ({rank}" + (f"; {how})" if how else ")")
    return f" ({who})" if who else ""
