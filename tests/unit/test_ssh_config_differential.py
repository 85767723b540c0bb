"""~/.ssh/config exactly as OpenSSH reads it (issue 38): every config of sshconfig_cases.py (by hand, one or
more per kind of difference the issue found, and a seeded generator of mixed ones), each lookup resolved by
clusterrun (with ssh on PATH, and without it: clusterrun's own reader) and by OpenSSH (`ssh -G`, no
connection), compared field by field: host name, port, user, identity files in order, the jump hosts and the
first one's ProxyCommand. A config ssh refuses must be refused. The harness: sshconfig_oracle.py.

Needs an OpenSSH client (CI installs openssh-client: docker/ci-prepare.sh). Every ssh runs in a private
mount namespace with its own /etc/hosts, so canonicalization is exercised and no DNS query leaves here."""

import os
import shutil
import stat

import pytest

import sshconfig_cases
from sshconfig_oracle import Oracle, SshFails, SshRunner, parse_g, run_corpus

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client (ssh) on PATH")

GENERATED = int(os.environ.get("CLUSTERRUN_SSH_DIFF_GENERATED", "120"))
SEED = 38


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    ssh = SshRunner(str(tmp_path_factory.mktemp("ssh-ns")), sshconfig_cases.HOSTS)
    yield ssh
    ssh.close()


def test_clusterrun_resolves_every_config_as_ssh_does(runner, tmp_path, monkeypatch):
    cases = sshconfig_cases.hand_written() + sshconfig_cases.generated(GENERATED, SEED)
    tally = run_corpus(cases, runner, monkeypatch, str(tmp_path))
    compared = tally.agree + tally.deliberate + tally.differ
    assert tally.differ == 0, f"{tally.differ} of {compared} lookups differ from ssh:\n" + "\n".join(tally.details[:25])
    assert compared >= 2 * sum(len(c.lookups) for c in cases if runner.private or not c.needs_dns)
    if runner.private:  # where no private namespace can be made, canonicalization is not given to ssh
        assert tally.uncompared == 0


RECORDER = "#!/bin/sh\nprintf '%s' \"$2\" > \"$CR_RECORD\"\n"


def test_the_oracle_builds_the_proxy_commands_ssh_runs(runner, tmp_path):
    """The oracle rebuilds what ssh does after `ssh -G` (a ProxyCommand's tokens, ProxyJump's nested ssh):
    checked against ssh itself, with a $SHELL that records the command ssh hands it and ends (ssh then
    fails at the key exchange: nothing connects)."""
    recorder = tmp_path / "recorder.sh"
    recorder.write_text(RECORDER)
    recorder.chmod(stat.S_IRWXU)
    cases = [c for c in sshconfig_cases.hand_written() if "proxy" in c.config.lower() and "exec" not in c.config
             and not c.needs_dns]
    checked = 0
    for number, case in enumerate(cases):
        cfg = case.write(str(tmp_path / f"case{number}"))
        env = dict(os.environ, **case.env)
        oracle = Oracle(runner, cfg, env)
        for lk in case.lookups:
            rc, out, _ = runner.run(["ssh", "-G", "-F", cfg, "--", lk.alias], env)
            g = parse_g(out) if rc == 0 else {}
            if "proxycommand" not in g and "proxyjump" not in g:
                continue
            record = tmp_path / f"record{number}-{lk.alias}"
            tokens = {"h": g["hostname"][0], "k": (g.get("hostkeyalias") or [lk.alias])[0], "n": lk.alias,
                      "p": g["port"][0], "r": g["user"][0]}
            try:
                expected = "exec " + oracle.proxy_command(g, tokens)
            except SshFails:
                expected = None
            runner.run(["ssh", "-F", cfg, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                        "-o", "UserKnownHostsFile=/dev/null", "--", lk.alias, "true"],
                       dict(env, SHELL=str(recorder), CR_RECORD=str(record)))
            assert (record.read_text() if record.exists() else None) == expected, (case.name, lk.alias)
            checked += 1
    assert checked >= 20
