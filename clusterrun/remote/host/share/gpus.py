"""The GPUs of this host, as nvidia-smi reports them, and which of them a run gets.

QUERY's output is one line per GPU: `index, uuid, memory.used, memory.total` (`0, GPU-5d3c..., 3 MiB,
81559 MiB`). A run wants `count` GPUs (one per rank) out of its candidates (the inventory's `gpus:` list,
or with `auto` every GPU the host reports); it gets free ones (no other run's live claim on them),
those that look idle first (under IDLE_SHARE of their memory in use: a process clusterrun does not know
about may hold the others), lowest index first, and its ranks see them in that order
(CUDA_VISIBLE_DEVICES), so `cuda:LOCAL_RANK` is the rank's own claimed GPU.
"""

QUERY = ["nvidia-smi", "--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader"]
IDLE_SHARE = 0.05
_UNITS = {"B": 1.0 / (1 << 20), "KiB": 1.0 / 1024, "MiB": 1.0, "GiB": 1024.0, None: 1.0}


def parse(text):
    """[{"index", "uuid", "used_mib", "total_mib"}] from QUERY's output; lines that are not a GPU's are
    left out (a driver message, `[N/A]` memory on some boards reads as unknown: None)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        out.append({"index": int(parts[0]), "uuid": parts[1], "used_mib": _mib(parts[2]),
                    "total_mib": _mib(parts[3])})
    return sorted(out, key=lambda g: g["index"])


def _mib(text):
    """MiB of `3 MiB`, `1.5 GiB`, `512 KiB`, `100 B` or a bare number; None otherwise (`[N/A]`). No
    regex: every claiming launch loads this module, and re (with enum) is ~6 ms of a host's start."""
    text = text.strip()
    number = text.rstrip("BKMGi").rstrip()
    unit = text[len(number):].strip() or None
    whole, dot, frac = number.partition(".")
    if unit not in _UNITS or not (whole.isascii() and whole.isdigit()) or (dot and not (frac.isascii() and frac.isdigit())):
        return None
    return float(number) * _UNITS[unit]


def query(timeout=20.0):
    """(GPUs, problem): this host's GPUs by nvidia-smi, or ([], why there are none to be had)."""
    import subprocess  # here: a push that claims no GPU never loads it (5 ms of every host's start)

    try:
        done = subprocess.run(QUERY, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except OSError as exc:
        return [], "nvidia-smi cannot be run (%s)" % (exc.strerror or exc)
    except subprocess.TimeoutExpired:
        return [], "nvidia-smi did not answer within %g s" % timeout
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()
        return [], "nvidia-smi failed (exit %d%s)" % (done.returncode, ": " + tail[-1] if tail else "")
    gpus = parse(done.stdout.decode("utf-8", "replace"))
    return gpus, "" if gpus else "nvidia-smi reports no GPU"


def idle(gpu):
    used, total = gpu.get("used_mib"), gpu.get("total_mib")
    return used is None or not total or used < IDLE_SHARE * total


def candidates(wanted, host_gpus):
    """The GPUs a run may have here: the indices named (checked against what the host reports, where it
    reports any), or with "auto" all of them. (list of gpu dicts, problem or "")."""
    if wanted == "auto":
        return list(host_gpus), ""
    known = dict((g["index"], g) for g in host_gpus)
    if known:
        absent = [i for i in wanted if i not in known]
        if absent:
            return [], "gpus: %s: this host has no GPU %s (nvidia-smi reports %s)" % (
                ",".join(str(i) for i in wanted), ",".join(str(i) for i in absent),
                ",".join(str(i) for i in sorted(known)))
    return [known.get(i) or {"index": i, "uuid": "", "used_mib": None, "total_mib": None} for i in wanted], ""


def choose(cands, count, taken, reserved=()):
    """`count` indices out of cands, none in `taken` (other runs' claims): ones no earlier waiter named
    (reserved) first, then idle before busy, lowest index first; returned in index order. None when
    fewer than count are free."""
    free = [g for g in cands if g["index"] not in taken]
    if len(free) < count:
        return None
    order = sorted(free, key=lambda g: (g["index"] in reserved, not idle(g), g["index"]))
    return sorted(g["index"] for g in order[:count])


SNAPSHOT = ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total",
            "--format=csv,noheader,nounits"]


def snapshot(timeout=5.0):
    """Each GPU's utilisation (%) and memory (MiB) now, for a hung run's hang.json:
    {"gpus": [{"index", "util_pct", "used_mib", "total_mib"}]}, or {"error": why there is none}."""
    import subprocess  # here, as above

    try:
        done = subprocess.run(SNAPSHOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except OSError as exc:
        return {"error": "nvidia-smi cannot be run (%s)" % (exc.strerror or exc)}
    except subprocess.TimeoutExpired:
        return {"error": "nvidia-smi did not answer within %g s" % timeout}
    if done.returncode != 0:
        return {"error": "nvidia-smi failed (exit %d)" % done.returncode}
    out = []
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and parts[0].isdigit():
            out.append({"index": int(parts[0]), "util_pct": _mib(parts[1]), "used_mib": _mib(parts[2]),
                        "total_mib": _mib(parts[3])})
    return {"gpus": out}
