"""The GPU preflight's pure rules: what a host's `gpu-check` answer (remote/host/share/gpu_health.py)
says about each GPU a run would use, then the hosts compared with each other.

Fail closed: a value nvidia-smi could not read ("[Unknown Error]", "[GPU requires reset]", a field
missing), an nvidia-smi that failed or hung, and a CUDA op that failed, hung or never ran are
failures that name the host and the GPU, never a pass. Values a board does not have ("N/A": ECC on a
GeForce, row remapping before Ampere) are not errors. `check` shows the verdicts in its `gpu` column;
launch (launch/gpu_gate.py) refuses to start, or leaves out a failing GPU where `gpus:` has another.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    from ..config.hosts import Host

from ..hosts.leftovers import holder_text, leftovers_request
from .rules import FAIL, OK, SKIP, WARN, CheckResult, disagreement

TEMP_WARN_C = 85  # when the board does not say where it slows down
SLOW_SHARE = 0.5  # a GPU under half its peers' median throughput is flagged
# Xids that mean the hardware (or its memory) is at fault, not the program (NVIDIA's Xid catalogue):
# 48 DBE, 61/62 internal micro-controller, 64 ECC page retirement failed, 74 NVLink, 79 fallen off the
# bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP, 140 unrecovered ECC
FATAL_XIDS = frozenset((48, 61, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140))
SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
RESET_HINT = "drain the GPU and reset it (`sudo nvidia-smi -r -i N`, or reboot the host)"


@dataclass(frozen=True)
class GpuVerdict:
    """One GPU of one host: what failed, what is worth a warning, and its measured throughput."""

    host: str
    index: int
    name: str = ""
    failures: Tuple[str, ...] = ()
    warnings: Tuple[str, ...] = ()
    tflops: Optional[float] = None

    @property
    def status(self) -> str:
        return FAIL if self.failures else WARN if self.warnings else OK

    def text(self) -> str:
        """`node1 GPU 1: 2 uncorrectable ECC errors since the driver loaded (volatile dram_uncorrectable)`"""
        return f"{self.host} GPU {self.index}: " + "; ".join(self.failures or self.warnings or ("healthy",))


@dataclass(frozen=True)
class HostGpus:
    """One host's GPU verdicts, and what concerns all of them (nvidia-smi, the driver)."""

    host: str
    gpus: Tuple[GpuVerdict, ...] = ()
    failures: Tuple[str, ...] = ()  # the host's own: nvidia-smi hung, the driver differs from the peers'
    warnings: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()  # what was not checked, and why (a kernel log this login may not read)
    driver: Optional[str] = None
    cuda: Optional[str] = None

    @property
    def status(self) -> str:
        if self.failures or any(g.status == FAIL for g in self.gpus):
            return FAIL
        return WARN if self.warnings or any(g.status == WARN for g in self.gpus) else OK

    def failing(self) -> List[str]:
        """Every failure, each naming the host (and the GPU)."""
        return [f"{self.host}: {f}" for f in self.failures] + [g.text() for g in self.gpus if g.status == FAIL]

    def warned(self) -> List[str]:
        return [f"{self.host}: {w}" for w in self.warnings] + [g.text() for g in self.gpus if g.status == WARN]


def unreadable(value: Optional[str]) -> bool:
    """nvidia-smi's ways of saying a value could not be read (a missing field counts too)."""
    if value is None:
        return True
    v = value.strip().lower()
    return v.startswith("[") and v not in ("[n/a]", "[not supported]") or v in ("err!", "unknown error", "")


def absent(value: Optional[str]) -> bool:
    """A value this board does not have."""
    return value is not None and value.strip().lower() in ("n/a", "[n/a]", "not supported", "[not supported]")


def number(value: Optional[str]) -> Optional[float]:
    m = _NUMBER.match(value or "")
    return float(m.group(1)) if m else None


def short_bus(bus_id: Optional[str]) -> str:
    """00000000:3B:00.0 (nvidia-smi) and 0000:3b:00 (the kernel's Xid line) → 3b:00."""
    parts = (bus_id or "").lower().split(".")[0].split(":")
    return ":".join(parts[-2:]) if len(parts) >= 2 else ""


# ------------------------------------------------------------------ one GPU


def _temperature(g: Mapping) -> Tuple[List[str], List[str]]:
    temp, slow = g.get("temp"), number(g.get("temp_slow"))
    if unreadable(temp) or number(temp) is None:
        return [f"temperature unreadable ({temp!r})"], []
    limit = slow if slow else TEMP_WARN_C
    if number(temp) >= limit:
        return [], [f"{temp} at or past {'its slowdown threshold' if slow else 'a safe temperature'} ({limit:.0f} C)"]
    return [], []


def _ecc(g: Mapping) -> Tuple[List[str], List[str]]:
    mode = g.get("ecc_mode")
    if unreadable(mode):
        return [f"ECC mode unreadable ({mode!r})"], []
    if (mode or "").lower() != "enabled":
        return [], []  # ECC off or absent (GeForce): nothing to count
    fails: List[str] = []
    warns: List[str] = []
    for scope, words, into in (("volatile", "since the driver loaded", fails),
                               ("aggregate", "in its lifetime", warns)):
        counters = g.get(scope) or {}
        if not counters:
            fails.append(f"ECC enabled but no {scope} uncorrectable counter reported")
        for name, value in sorted(counters.items()):
            count = None if unreadable(value) else number(value)
            if count is None and not absent(value):
                fails.append(f"{scope} ECC counter {name} unreadable ({value!r})")
            elif count:
                into.append(f"{count:.0f} uncorrectable ECC error{'s' if count != 1 else ''} {words} "
                            f"({scope} {name})")
    return fails, warns


def _retirement(g: Mapping) -> List[str]:
    out = []
    values = {k: g.get(k) for k in ("retired_pending", "remap_pending", "remap_failure")}
    for key, words in (("retired_pending", "memory pages pending retirement (takes effect on a reset)"),
                       ("remap_pending", "row remapping pending (takes effect on a reset)"),
                       ("remap_failure", "row remapping failed: the GPU needs service")):
        value = values[key]
        if value is not None and value.strip().lower() == "yes":
            out.append(words)
        elif value is not None and unreadable(value):
            out.append(f"{key.replace('_', ' ')} unreadable ({value!r})")
    ecc_on = (g.get("ecc_mode") or "").lower() == "enabled"
    known = [v for v in values.values() if v is not None and v.strip().lower() in ("yes", "no")]
    if ecc_on and not known and not out:
        out.append("neither retired pages nor remapped rows could be read")
    return out


def _persistence(g: Mapping) -> Tuple[List[str], List[str]]:
    value = g.get("persistence")
    if absent(value):
        return [], []
    if unreadable(value):
        return [f"persistence mode unreadable ({value!r})"], []
    if value.lower() == "disabled":
        return [], ["persistence mode off (the driver unloads between processes: slow starts; "
                    "`sudo nvidia-smi -pm 1` or nvidia-persistenced)"]
    return [], []


def _throttle(g: Mapping) -> Tuple[List[str], List[str]]:
    reasons = g.get("throttle") or {}
    bad = sorted(k for k, v in reasons.items() if unreadable(v))
    active = [k for k in SLOWDOWNS if (reasons.get(k) or "").lower() == "active"]
    return ([f"clock throttle reasons unreadable ({', '.join(bad)})"] if bad else [],
            [f"clocks throttled ({', '.join(active)})"] if active else [])


def _xids(g: Mapping, events: Sequence[Mapping]) -> Tuple[List[str], List[str]]:
    mine = [e for e in events if short_bus(e.get("bus_id")) == short_bus(g.get("bus_id")) and short_bus(e.get("bus_id"))]
    fatal = [e for e in mine if e.get("xid") in FATAL_XIDS]
    other = [e for e in mine if e.get("xid") not in FATAL_XIDS]

    def said(found: Sequence[Mapping]) -> str:
        last = found[-1]
        return f"Xid {', '.join(sorted({str(e['xid']) for e in found}))} in the kernel log " \
               f"(last: Xid {last['xid']}, {last.get('text', '')})".replace(", )", ")")
    return ([said(fatal)] if fatal else []), ([said(other)] if other else [])


def _op(index: int, op: Optional[Mapping]) -> Tuple[List[str], Optional[float]]:
    if op is None:
        return [], None
    result = next((r for r in op.get("results", ()) if r.get("index") == index), None)
    if result is not None and result.get("ok"):
        return [], result.get("tflops")
    if result is not None:
        return [f"CUDA op failed: {result.get('error') or 'no reason given'}"], None
    if op.get("timed_out"):
        return [f"CUDA op did not finish within {op.get('timeout', 0):g} s (hung on this GPU or one before it)"], None
    return [f"CUDA op did not run: {op.get('error') or 'no answer for this GPU'}"], None


def judge_gpu(host: str, g: Mapping, events: Sequence[Mapping], op: Optional[Mapping]) -> GpuVerdict:
    fails, warns = [], []
    for rule in (_temperature, _ecc, _persistence, _throttle):
        f, w = rule(g)
        fails += f
        warns += w
    fails += _retirement(g)
    f, w = _xids(g, events)
    fails, warns = fails + f, warns + w
    f, tflops = _op(g["index"], op)
    return GpuVerdict(host, g["index"], g.get("name") or "", tuple(fails + f), tuple(warns), tflops)


# ------------------------------------------------------------------ one host


def judge_host(host: str, wanted: Union[str, Sequence[int]], answer: Mapping) -> HostGpus:
    """One host's verdicts on the GPUs a run would use (wanted: "auto" or indices)."""
    smi, xid, op = answer.get("smi") or {}, answer.get("xid") or {}, answer.get("op")
    notes = _xid_notes(xid)
    if "error" in smi or "gpus" not in smi:
        why = smi.get("error") or "no nvidia-smi answer"
        unchecked = [] if wanted == "auto" else list(wanted)
        return HostGpus(host, tuple(GpuVerdict(host, i, failures=(f"unchecked: {why}",)) for i in unchecked),
                        (why,), notes=notes)
    reported = {g["index"]: g for g in smi["gpus"]}
    indices = sorted(reported) if wanted == "auto" else list(wanted)
    by_gpu, held = _holder_warnings(answer.get("holders") or ())
    gpus = tuple(_with_holders(judge_gpu(host, reported[i], xid.get("events") or (), op), by_gpu.get(i, ()))
                 if i in reported else _not_reported(host, i, reported) for i in indices)
    return HostGpus(host, gpus, tuple(_version_failures(smi) + ([] if indices else ["nvidia-smi reports no GPU"])),
                    tuple(held), notes=notes, driver=smi.get("driver"), cuda=smi.get("cuda"))


def _with_holders(v: GpuVerdict, held: Sequence[str]) -> GpuVerdict:
    return replace(v, warnings=v.warnings + tuple(held)) if held else v


def _xid_notes(xid: Mapping) -> Tuple[str, ...]:
    if xid.get("readable"):
        return ()
    return (f"Xid not checked: the kernel log is not readable ({xid.get('error') or 'no answer'})",)


def _not_reported(host: str, index: int, reported: Mapping[int, Mapping]) -> GpuVerdict:
    have = ", ".join(map(str, sorted(reported))) or "none"
    return GpuVerdict(host, index, failures=(f"nvidia-smi reports no GPU {index} (it has {have})",))


def _version_failures(smi: Mapping) -> List[str]:
    return [f"{what} unreadable ({smi.get(key)!r})" for key, what in (("driver", "driver version"),
                                                                       ("cuda", "CUDA version"))
            if unreadable(smi.get(key))]


def judge_all(hosts: Sequence["Host"], facts: Mapping[str, Mapping]) -> Tuple[Dict[str, HostGpus], List[str]]:
    """check's verdicts: judge_host on every host whose facts hold a GPU preflight answer, then
    judge_peers."""
    wanted = {h.name: h.gpus for h in hosts}
    return judge_peers({h: judge_host(h, wanted[h], f["gpu"]) for h, f in facts.items() if f.get("gpu")})


# ------------------------------------------------------------------ the hosts together


def judge_peers(hosts: Mapping[str, HostGpus]) -> Tuple[Dict[str, HostGpus], List[str]]:
    """Driver and CUDA versions must agree across hosts; a GPU under half its peers' median throughput is
    flagged. Returns the verdicts with those findings added, and notes naming each disagreement."""
    out = dict(hosts)
    notes: List[str] = []
    for key, what in (("driver", "NVIDIA driver"), ("cuda", "CUDA (driver API)")):
        odd, note = disagreement(what, {h: getattr(v, key) for h, v in hosts.items()
                                        if not unreadable(getattr(v, key))})
        if note:
            notes.append(note)
        for h, why in odd.items():
            out[h] = replace(out[h], failures=out[h].failures + (why,))
    return _flag_slow(out), notes


def _flag_slow(hosts: Dict[str, HostGpus]) -> Dict[str, HostGpus]:
    """Each GPU under SLOW_SHARE of the median of every other measured GPU (of all hosts) gets a warning."""
    out = dict(hosts)
    measured = [(h, g) for h, v in hosts.items() for g in v.gpus if g.tflops]
    for h, g in measured:
        others = [x.tflops for hh, x in measured if (hh, x.index) != (h, g.index)]
        if len(others) >= 2 and g.tflops < SLOW_SHARE * statistics.median(others):
            slow = replace(g, warnings=g.warnings + (f"slow: {g.tflops:g} TFLOPS, under half the other GPUs' "
                                                     f"median ({statistics.median(others):g})",))
            out[h] = replace(out[h], gpus=tuple(slow if x.index == g.index else x for x in out[h].gpus))
    return out


def usable(h: HostGpus, wanted: Union[None, str, Sequence[int]], count: int) -> Optional[Tuple[int, ...]]:
    """The GPUs a run may still use here when only some GPUs failed and `gpus:` leaves enough others
    (None: it cannot avoid them, or nothing failed)."""
    bad = [g for g in h.gpus if g.status == FAIL]
    if not bad or h.failures or wanted is None:
        return None
    good = tuple(g.index for g in h.gpus if g.status != FAIL)
    return good if len(good) >= count else None


def gpu_result(h: Optional[HostGpus]) -> CheckResult:
    """check's `gpu` column for one host."""
    if h is None:
        return CheckResult("gpu", SKIP, "the run uses no GPU here (gpus: none)", "", "·")
    data = {"driver": h.driver, "cuda": h.cuda, "notes": list(h.notes),
            "gpus": [{"index": g.index, "name": g.name, "status": g.status, "failures": list(g.failures),
                      "warnings": list(g.warnings), "tflops": g.tflops} for g in h.gpus]}
    notes = f" ({'; '.join(h.notes)})" if h.notes else ""
    if h.status == FAIL:
        failing = h.failing()
        return CheckResult("gpu", FAIL, "; ".join(failing) + notes, RESET_HINT if any(
            "reset" in f for f in failing) else "leave the GPU out of gpus: until it is fixed, or skip with "
            "--no-gpu-check", f"{len(failing)} failed", data)
    measured = [g.tflops for g in h.gpus if g.tflops]
    what = f"{len(h.gpus)} GPU{'s' if len(h.gpus) != 1 else ''}, driver {h.driver}, CUDA {h.cuda}" + (
        f", matmul {min(measured):g}-{max(measured):g} TFLOPS" if measured else "")
    if h.status == WARN:
        return CheckResult("gpu", WARN, what + ": " + "; ".join(h.warned()) + notes, "", f"{len(h.gpus)} GPU", data)
    return CheckResult("gpu", OK, what + notes, "", f"{len(h.gpus)} GPU", data)


def gpu_request(host: "Host", command_timeout: float, run: str = "") -> Optional[dict]:
    """What a host's `gpu-check` (or check's probe) is asked, None where the run uses no GPU there or
    the inventory turned the check off (gpu_check: false). Its deadlines fit in one remote command's;
    run: the launch's own run id (its processes are not leftovers)."""
    if host.gpus is None or not host.gpu_check:
        return None
    return {"gpus": list(host.gpus) if isinstance(host.gpus, tuple) else host.gpus, "python": host.python,
            "env": dict(host.env), "smi_timeout": min(10.0, command_timeout / 4),
            "op_timeout": min(40.0, command_timeout / 2), "leftovers": leftovers_request(host, run)}


def _holder_warnings(holders: Sequence[Mapping]) -> Tuple[Dict[int, List[str]], List[str]]:
    """Warnings of the processes that hold GPUs (not this run's own), by GPU index, and for the host."""
    by_gpu: Dict[int, List[str]] = {}
    host: List[str] = []
    for h in holders:
        if h.get("label") == "this-run":
            continue
        text = "held by " + holder_text(h)
        for i in h.get("gpus") or ():
            by_gpu.setdefault(int(i), []).append(text)
        if not h.get("gpus"):
            host.append("a GPU device " + text)
    return by_gpu, host


def request_seconds(request: Mapping) -> float:
    """How long a `gpu-check` may take on its host, both deadlines and the host program's start."""
    return float(request["smi_timeout"]) + float(request["op_timeout"]) + 10.0
