"""Secrets are masked here, at the source: this host has their values (from the run's 0600 spec), so
what it sends (log bytes, exit records, setup output) never carries them, whatever the controller's shell
knows. Masking keeps lengths (each byte of a value becomes `*`), so byte offsets stay true.

A value can be split anywhere (a flush between its halves, a read cut): `holdback` says how many bytes at
the end of what is ready to send could be the start of a value; those wait for more output (or the end).

When a run has ended on this host, `scrub_run` masks the log files in place and removes the values from
spec.json: nothing on the host keeps them past the run.
"""

import os

from .stdlib import json
from .files import write_json_atomic

MIN_SECRET = 4  # the controller refuses shorter values
SCRUB_CHUNK = 1 << 20


def secret_values(spec):
    """The run's secret values, as bytes, longest first (from the ranks' env, or torchrun's)."""
    names = spec.get("secret_names") or []
    if not names:
        return []
    envs = [spec.get("env") or {}] + [r.get("env") or {} for r in spec.get("ranks", [])]
    values = {env[n] for env in envs for n in names if isinstance(env.get(n), str) and env[n] != "***"}
    return sorted((v.encode() for v in values if len(v) >= MIN_SECRET), key=len, reverse=True)


class Masker:
    def __init__(self, values):
        values = [v for v in values if v]
        # in JSON (exit and worker records) a value with quotes, backslashes or control bytes is escaped
        escaped = [json.dumps(v.decode("utf-8", "surrogateescape"))[1:-1].encode("utf-8", "surrogateescape")
                   for v in values]
        self.values = sorted(set(values) | {e for e in escaped if e}, key=len, reverse=True)
        self.longest = max((len(v) for v in self.values), default=0)

    def __bool__(self):
        return bool(self.values)

    def mask(self, data):
        for value in self.values:
            if value in data:
                data = data.replace(value, b"*" * len(value))
        return data

    def holdback(self, data):
        """How many bytes at the end of data might begin a value (they must wait: the rest may follow)."""
        best = 0
        for value in self.values:
            for k in range(min(len(value) - 1, len(data)), best, -1):
                if data.endswith(value[:k]):
                    best = k
                    break
        return best

    def mask_text(self, text):
        if not self.values or not isinstance(text, str):
            return text
        return self.mask(text.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")

    def mask_record(self, record):
        return {k: self.mask_text(v) if isinstance(v, str) else v for k, v in record.items()}


def _scrub_file(path, masker):
    """Overwrite every occurrence of a value in the file with `*` (same length), in place."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return
    try:
        offset, carry = 0, b""
        while True:
            chunk = os.pread(fd, SCRUB_CHUNK, offset)
            if not chunk:
                break
            data = carry + chunk
            start = offset - len(carry)
            masked = masker.mask(data)
            if masked != data:
                os.pwrite(fd, masked, start)
            keep = min(len(data), masker.longest - 1)
            carry = data[len(data) - keep:] if keep else b""
            offset += len(chunk)
    finally:
        os.close(fd)


def scrub_run(run_dir, spec):
    """Once the run has ended on this host (or its supervisor is found dead): mask every file the run left
    in its folder in place (logs, exit records, torchrun's worker records and error files, setup and
    notify output), then drop the values from spec.json. Not the pushed job (its files are the content
    cache's), nor the checkpoints and outputs (the job's own data), nor other attempts' folders (each has
    its own supervisor)."""
    masker = Masker(secret_values(spec))
    if not masker:
        return
    for path in run_files(run_dir):
        if os.path.basename(path) != "spec.json":
            _scrub_file(path, masker)
    names = spec.get("secret_names") or []
    scrubbed = json.loads(json.dumps(spec))
    for env in [scrubbed.get("env") or {}] + [r.get("env") or {} for r in scrubbed.get("ranks", [])]:
        for name in names:
            if name in env:
                env[name] = "***"
    write_json_atomic(os.path.join(run_dir, "spec.json"), scrubbed)


KEEP_OUT = ("job", "checkpoints", "outputs")


def run_files(run_dir):
    """Every regular file of this attempt's folder but the job's, its checkpoints and other attempts'."""
    out = []
    for folder, dirs, files in os.walk(run_dir):
        if folder == run_dir:
            dirs[:] = [d for d in dirs if d not in KEEP_OUT and not d.startswith("attempt-")]
        for name in files:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(path)
    return out
