"""Host keys, authentication, secrets, file modes, and hostile values over real SSH."""

import hashlib
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from faultkit import FAST

pytestmark = pytest.mark.integration

SHOW = {"script": "show.py", "args": []}


def known_hosts_lines(cluster):
    return Path(cluster.known_hosts_path).read_text().splitlines()


def test_strict_rejects_an_unknown_host_key_with_its_fingerprint_and_the_fix(cr, cluster, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("\n".join(ln for ln in known_hosts_lines(cluster) if not ln.startswith(cluster.host("node1").address + " ")) + "\n")
    inv = cr.inventory(job=SHOW, defaults={"known_hosts": str(kh)}, top={"timeouts": FAST})
    done = cr.run("launch", inv)
    assert done.returncode == 3, done.stderr
    assert "node1: unknown host key" in done.stderr
    assert re.search(r"SHA256:[A-Za-z0-9+/]{43}", done.stderr)
    assert "ssh-keyscan" in done.stderr and "accept-new" in done.stderr
    assert "nothing was started" in done.stderr


def test_accept_new_records_new_keys_and_then_trusts_them(cr, cluster, tmp_path):
    kh = tmp_path / "known_hosts"
    inv = cr.inventory(job=SHOW, defaults={"known_hosts": str(kh), "host_key_policy": "accept-new"},
                       top={"timeouts": FAST})
    done = cr.run("launch", inv)
    assert done.returncode == 0, done.stderr
    assert sorted(kh.read_text().splitlines()) == sorted(known_hosts_lines(cluster))
    assert stat.S_IMODE(os.stat(kh).st_mode) == 0o600
    assert cr.run("launch", inv).returncode == 0


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
def test_a_changed_host_key_is_refused_under_every_policy(cr, cluster, tmp_path, policy):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = (tmp_path / "other.pub").read_text().split()[1]
    addr = cluster.host("node2").address
    lines = [f"{addr} ssh-ed25519 {other}" if ln.startswith(addr + " ") else ln for ln in known_hosts_lines(cluster)]
    kh = tmp_path / "known_hosts"
    kh.write_text("\n".join(lines) + "\n")
    inv = cr.inventory(job=SHOW, defaults={"known_hosts": str(kh), "host_key_policy": policy}, top={"timeouts": FAST})
    done = cr.run("launch", inv)
    assert done.returncode == 3, done.stderr
    assert "node2: HOST KEY CHANGED" in done.stderr and "ssh-keygen -R" in done.stderr
    assert kh.read_text() == "\n".join(lines) + "\n"  # the recorded key is never replaced


def test_a_wrong_key_is_an_auth_failure_naming_every_host(cr, cluster, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "wrong")], check=True)
    inv = cr.inventory(job=SHOW, defaults={"identity_file": str(tmp_path / "wrong")}, top={"timeouts": FAST})
    done = cr.run("launch", inv, )
    assert done.returncode == 3, done.stderr
    for n in range(4):
        assert f"node{n}: authentication failed" in done.stderr


SECRET = "s3cr3t-Value-93f1"


def test_secrets_reach_the_ranks_and_never_clusterruns_output(cr, cluster, tmp_path):
    cr.env["TOKEN"] = SECRET
    inv = cr.inventory(job={**SHOW, "args": ["--leak", "--fail"]}, top={"timeouts": FAST, "secrets": ["TOKEN"]})
    done = cr.run("launch", inv)
    assert done.returncode == 1  # the failure path, with a root-cause tail that quotes the secret
    shas = {json.loads(ln.split("] ", 1)[1])["token_sha"] for ln in done.stdout.splitlines() if '"token_sha"' in ln}
    assert shas == {hashlib.sha256(SECRET.encode()).hexdigest()}  # every rank received it
    outputs = [done.stdout, done.stderr, cr.run("ps", "--json").stdout, cr.run("logs").stdout,
               cr.run("launch", "--dry-run", inv).stdout, cr.run("launch", "--dry-run", "--json", inv).stdout]
    for text in outputs:
        assert SECRET not in text
    assert "oops, printing the token: ***" in done.stdout
    home = Path(cr.env["CLUSTERRUN_HOME"])
    assert SECRET.encode() not in (home / "runs.db").read_bytes()
    assert all(SECRET.encode() not in p.read_bytes() for p in home.glob("runs.db*"))
    del cr.env["TOKEN"]
    missing = cr.run("launch", inv)
    assert missing.returncode == 2 and "TOKEN" in missing.stderr and SECRET not in missing.stderr


def test_state_and_run_folders_are_private(cr, cluster):
    inv = cr.inventory(job=SHOW, top={"timeouts": FAST, "secrets": ["TOKEN"]})
    cr.env["TOKEN"] = SECRET
    done = cr.run("launch", inv)
    assert done.returncode == 0, done.stderr
    home = Path(cr.env["CLUSTERRUN_HOME"])
    run_id = cr.ps()[0]["id"]
    modes = {p.relative_to(home).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [home, *home.rglob("*")]}
    for path, mode in modes.items():
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    rc, out, _ = cluster.exec("node1", ["sh", "-c", f"cd ~/.clusterrun && stat -c '%a %n' . runs runs/{run_id} "
                                                    f"runs/{run_id}/spec.json runs/{run_id}/rank-1.log cache bin"])
    assert rc == 0
    for line in out.splitlines():
        mode, name = line.split(" ", 1)
        assert int(mode, 8) & 0o077 == 0, line
    # the value was in the 0600 spec file while the run lived; once it ended there, it left that file too
    rc, out, _ = cluster.exec("node1", ["cat", f"/home/cr/.clusterrun/runs/{run_id}/spec.json"])
    assert rc == 0 and SECRET not in out and '"TOKEN": "***"' in out


HOSTILE = ["a b", "$(touch /tmp/pwned)", "'", '"', "`id`", "a;b|c&d", "new\nline", "*", "~", "\\", "$HOME", "",
           "--rank", "ünïcode ✓"]


def test_hostile_values_reach_the_rank_byte_exact_and_no_shell_runs_them(cr, cluster):
    env = {"HOSTILE": "$(touch /tmp/pwned2) `id` ; rm -rf ~", "NEWLINE": "one\ntwo", "QUOTES": "'\"'\"'"}
    inv = cr.inventory(job={**SHOW, "args": HOSTILE}, defaults={"env": {"OMP_NUM_THREADS": "1", **env}},
                       top={"timeouts": FAST})
    done = cr.run("launch", inv)
    assert done.returncode == 0, done.stderr
    got = [json.loads(ln.split("] ", 1)[1]) for ln in done.stdout.splitlines() if '"argv"' in ln]
    assert len(got) == 4
    for rank, seen in enumerate(sorted(got, key=lambda g: g["argv"][1])):
        assert seen["argv"] == ["--rank", str(rank), "--world-size", "4"] + HOSTILE
        assert {k: seen["env"][k] for k in env} == env
    for n in range(4):
        rc, _, _ = cluster.exec(f"node{n}", ["sh", "-c", "test ! -e /tmp/pwned && test ! -e /tmp/pwned2"])
        assert rc == 0


def test_no_agent_forwarding(cr, cluster, tmp_path):
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True).stdout
    sock = re.search(r"SSH_AUTH_SOCK=([^;]+);", agent).group(1)
    pid = int(re.search(r"SSH_AGENT_PID=(\d+);", agent).group(1))
    try:
        subprocess.run(["ssh-add", str(cluster.key_path)], env={**os.environ, "SSH_AUTH_SOCK": sock},
                       capture_output=True, check=True)
        cr.env["SSH_AUTH_SOCK"] = sock  # an agent holding the cluster's key: it must not reach the hosts
        inv = cr.inventory(job=SHOW, top={"timeouts": FAST})
        done = cr.run("launch", inv)
        assert done.returncode == 0, done.stderr
        envs = [json.loads(ln.split("] ", 1)[1])["env"] for ln in done.stdout.splitlines() if '"argv"' in ln]
        assert envs and all(e["SSH_AUTH_SOCK"] is None for e in envs)
    finally:
        os.kill(pid, 15)
