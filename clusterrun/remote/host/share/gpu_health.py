"""This host's GPUs as they really are: nvidia-smi's full report, the kernel log's Xid lines, and a real
CUDA operation on each GPU with the run's Python, every one of them under a deadline.

This module only gathers raw values; the controller's pure rules (clusterrun/check/gpu_rules.py)
judge them, fail-closed: a value that could not be read is kept as what nvidia-smi printed (its
"[Unknown Error]", "[GPU requires reset]"), or left out, and the rules treat both as a failure. It
imports nothing but the standard library and nothing of the host program, because `check`'s probe
runs it from its source (GPU_SOURCE) on hosts where the host program is not installed.

Protocol (`gpu-check`, one JSON request on stdin, one JSON line answered):
  request  {"gpus": "auto" | [indices], "python": the run's Python, "env": the host's env:,
            "smi": "nvidia-smi", "smi_timeout": s, "op_timeout": s, "kmsg": "/dev/kmsg", "op": true,
            "leftovers": the `leftovers` request (its devices, the asking run, the claims folder)}
  answer   {"smi": {"driver", "cuda", "gpus": [{"index", "uuid", "name", "bus_id", "persistence",
                    "temp", "temp_slow", "ecc_mode", "volatile": {counter: value}, "aggregate": {...},
                    "retired_pending", "remap_pending", "remap_failure", "throttle": {reason: value}}]}
                   | {"error": why nvidia-smi gave nothing},
            "xid": {"readable": bool, "source", "events": [{"bus_id", "xid", "text"}]} | {"readable": false, "error"},
            "op": {"results": [{"index", "ok", "tflops", "seconds", "error"}], "error": why none ran,
                   "timeout": s},
            "holders": the processes that hold the GPUs (share/leftovers.py; not in check's probe)}
"""

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

SMI_XML = ["-q", "-x"]
KMSG = "/dev/kmsg"
KMSG_MAX_BYTES = 8 << 20  # a kernel ring buffer is a few MB at most; never read for ever
# NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),(.*)")

# The CUDA op, run with the run's Python: allocate, multiply, synchronize, check the result, per GPU,
# one JSON line as each GPU finishes (a GPU that hangs is then named by the lines that never came).
CUDA_OP = r'''
import json, sys, time
def say(d):
    sys.stdout.write(json.dumps(d) + "\n"); sys.stdout.flush()
try:
    import torch
except BaseException as exc:
    say({"error": "import torch failed: %s: %s" % (type(exc).__name__, exc)}); sys.exit(0)
try:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
except BaseException as exc:
    say({"error": "torch.cuda failed: %s: %s" % (type(exc).__name__, exc)}); sys.exit(0)
if not n:
    say({"error": "torch %s sees no CUDA device (torch.cuda.is_available() is False)" % torch.__version__})
    sys.exit(0)
N, REPS = 2048, 8
for i in [int(a) for a in sys.argv[1:]]:
    out, t0 = {"index": i}, time.perf_counter()
    try:
        if i >= n:
            raise RuntimeError("torch sees only %d GPU(s)" % n)
        dev = torch.device("cuda", i)
        a = torch.randn(N, N, device=dev)
        b = torch.randn(N, N, device=dev)
        c = a @ b
        torch.cuda.synchronize(dev)
        t1 = time.perf_counter()
        for _ in range(REPS):
            c = a @ b
        torch.cuda.synchronize(dev)
        dt = max(time.perf_counter() - t1, 1e-9)
        s = float(c.float().abs().sum().item())
        if s != s or s == float("inf"):
            raise RuntimeError("the product is not finite (%r)" % s)
        out.update(ok=True, tflops=round(2.0 * N ** 3 * REPS / dt / 1e12, 3))
    except BaseException as exc:
        text = str(exc).strip().splitlines()
        out.update(ok=False, error="%s: %s" % (type(exc).__name__, text[0] if text else ""))
    out["seconds"] = round(time.perf_counter() - t0, 3)
    say(out)
'''


# ------------------------------------------------------------------ nvidia-smi -q -x


def _text(node, *paths):
    """The text at the first of paths that exists under node (None: none does, an unreadable value)."""
    for path in paths:
        found = node.find(path)
        if found is not None:
            return (found.text or "").strip()
    return None


def _counters(node, path):
    """{counter: value} of the uncorrectable ECC counters under path (sram_/dram_uncorrectable of recent
    drivers, double_bit.total of older ones); {} when the block is missing."""
    block = node.find(path)
    out = {}
    for child in [] if block is None else list(block):
        if len(child) and "double_bit" in child.tag:
            out[child.tag + ".total"] = _text(child, "total")
        elif not len(child) and "uncorrectable" in child.tag:
            out[child.tag] = (child.text or "").strip()
    return out


def parse_smi_xml(text):
    """{"driver", "cuda", "gpus": [...]} from `nvidia-smi -q -x` (each GPU's index: its place in the
    report, as nvidia-smi numbers them). ValueError when it is not that XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError("nvidia-smi -q -x printed no readable XML (%s)" % exc) from None
    if root.tag != "nvidia_smi_log":
        raise ValueError("nvidia-smi -q -x printed <%s>, not <nvidia_smi_log>" % root.tag)
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        throttle = gpu.find("clocks_event_reasons")
        if throttle is None:
            throttle = gpu.find("clocks_throttle_reasons")
        gpus.append({
            "index": index, "uuid": _text(gpu, "uuid"), "name": _text(gpu, "product_name"),
            "bus_id": _text(gpu, "pci/pci_bus_id") or gpu.get("id"),
            "persistence": _text(gpu, "persistence_mode"),
            "temp": _text(gpu, "temperature/gpu_temp"),
            "temp_slow": _text(gpu, "temperature/gpu_temp_slow_threshold"),
            "ecc_mode": _text(gpu, "ecc_mode/current_ecc"),
            "volatile": _counters(gpu, "ecc_errors/volatile"),
            "aggregate": _counters(gpu, "ecc_errors/aggregate"),
            "retired_pending": _text(gpu, "retired_pages/pending_retirement", "retired_pages/pending_blacklist"),
            "remap_pending": _text(gpu, "remapped_rows/remapped_row_pending"),
            "remap_failure": _text(gpu, "remapped_rows/remapped_row_failure"),
            "throttle": {} if throttle is None else dict(
                (c.tag.replace("clocks_event_reason_", "").replace("clocks_throttle_reason_", ""),
                 (c.text or "").strip()) for c in throttle if not len(c)),
        })
    return {"driver": _text(root, "driver_version"), "cuda": _text(root, "cuda_version"), "gpus": gpus}


def run_deadline(argv, timeout, env=None):
    """(exit code, stdout, stderr, why it gave nothing: "" when it ran), never waiting past timeout."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, start_new_session=True)
    except OSError as exc:
        return None, "", "", "%s cannot be run (%s)" % (argv[0], exc.strerror or exc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return None, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), \
            "%s did not finish within %g s" % (os.path.basename(argv[0]), timeout)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), ""


def _kill_group(proc):
    """Our own child's session (started with start_new_session): a wedged nvidia-smi and what it forked."""
    try:
        os.killpg(proc.pid, 9)
    except OSError:
        proc.kill()


def smi_facts(smi, timeout):
    code, out, err, why = run_deadline([smi] + SMI_XML, timeout)
    if why:
        return {"error": why}
    if code != 0:
        tail = (err.strip() or out.strip()).splitlines()
        return {"error": "%s -q -x failed (exit %d)%s" % (smi, code, ": " + tail[-1] if tail else "")}
    try:
        return parse_smi_xml(out)
    except ValueError as exc:
        return {"error": str(exc)}


# ------------------------------------------------------------------ the kernel log


def parse_xids(text):
    """[{"bus_id", "xid", "text"}] of the NVRM Xid lines in a kernel log."""
    out = []
    for line in text.splitlines():
        m = _XID.search(line)
        if m:
            out.append({"bus_id": m.group(1).lower(), "xid": int(m.group(2)), "text": m.group(3).strip()[:200]})
    return out


def read_kmsg(path, max_bytes=KMSG_MAX_BYTES):
    """The kernel log's records from /dev/kmsg (non-blocking: it ends where the ring buffer does)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks, size = [], 0
    try:
        while size < max_bytes:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: a record overwritten while we read; go on with the next
                    continue
                raise
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def xid_facts(path):
    """Xid events since boot, where the kernel log may be read (dmesg_restrict keeps most logins out)."""
    try:
        return {"readable": True, "source": path, "events": parse_xids(read_kmsg(path))}
    except OSError as exc:
        return {"readable": False, "source": path, "error": "%s: %s" % (path, exc.strerror or exc)}


# ------------------------------------------------------------------ the CUDA op


def op_env(env):
    """The run's env for the op, with torch's device numbers those of nvidia-smi (PCI bus order, all GPUs)."""
    out = dict(os.environ)
    out.update(env or {})
    out.pop("CUDA_VISIBLE_DEVICES", None)
    out["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return out


def parse_op(out):
    """(results by GPU, the op's own error or "") from the op's JSON lines."""
    results, error = [], ""
    for line in out.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and "index" in item:
            results.append(item)
        elif isinstance(item, dict) and "error" in item:
            error = str(item["error"])
    return results, error


def cuda_op(python, indices, env, timeout):
    """One short process: the CUDA op on every GPU in indices, all within timeout."""
    t0 = time.time()
    code, out, err, why = run_deadline([python, "-c", CUDA_OP] + [str(i) for i in indices], timeout, op_env(env))
    results, error = parse_op(out)
    answer = {"results": results, "timeout": timeout, "seconds": round(time.time() - t0, 3)}
    if why:
        answer["error"] = "the CUDA op " + why.split(" ", 1)[1] if " " in why else why
        answer["timed_out"] = code is None and "within" in why
    elif error:
        answer["error"] = error
    elif code != 0 and len(results) < len(indices):
        tail = err.strip().splitlines()
        answer["error"] = "the CUDA op died (exit %s)%s" % (code, ": " + tail[-1][:200] if tail else "")
    return answer


# ------------------------------------------------------------------ the command


def wanted_indices(wanted, smi):
    """The GPUs to look at: those named, or with "auto" every GPU nvidia-smi reported."""
    if wanted == "auto" or wanted is None:
        return [g["index"] for g in smi.get("gpus", [])]
    return [int(i) for i in wanted]


def check(request):
    """Everything `gpu-check` answers, for the request's GPUs."""
    smi = smi_facts(request.get("smi") or "nvidia-smi", float(request.get("smi_timeout", 10.0)))
    answer = {"smi": smi, "xid": xid_facts(request.get("kmsg") or KMSG)}
    indices = wanted_indices(request.get("gpus"), smi)
    if request.get("op", True) and indices:
        answer["op"] = cuda_op(request.get("python") or sys.executable, indices, request.get("env"),
                               float(request.get("op_timeout", 60.0)))
    return answer


def cmd_gpu_check(workdir):
    # not at the top: check's probe runs this module from its source alone (no holders there)
    from ..wire import reply
    from .leftovers import scan

    request = json.loads(sys.stdin.read() or "{}")
    answer = check(request)
    answer["holders"], answer["hidden"] = scan(workdir, request.get("leftovers") or {})
    reply(answer)
    return 0
