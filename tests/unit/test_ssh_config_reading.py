"""~/.ssh/config as OpenSSH reads it: Include, Host and Match blocks, first value wins, tokens; checked
against `ssh -G` itself where an OpenSSH client is installed."""

import os
import shutil
import subprocess

import pytest

from clusterrun.config.inventory import parse_inventory
from clusterrun.config.ssh_config import from_openssh, match_list, read_config, ssh_target

HAVE_SSH = shutil.which("ssh") is not None


def resolve(cfg, alias, **kw):
    return read_config(alias, files=((str(cfg), False),), local_user="me", home=str(cfg.parent), **kw)


def openssh(cfg, alias, user=None):
    argv = ["ssh", "-G", "-F", str(cfg)] + (["-l", user] if user else []) + [alias]
    return subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=True).stdout


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def lab(tmp_path):
    """A config laid out as people do: the main file includes config.d/*, where the hosts are."""
    write(tmp_path / "config.d" / "lab.conf", "Host labnode*\n  User labuser\n  IdentityFile ~/.ssh/lab_%h\n"
          "Host labnode1\n  HostName 10.1.2.3\n  Port 2222\n  ProxyJump jumpy\n")
    write(tmp_path / "config.d" / "other.conf", "Host other\n  HostName 10.9.9.9\n")
    return write(tmp_path / "config", f"Include {tmp_path}/config.d/*.conf\n\nHost *\n  User fallback\n"
                                      "  ServerAliveInterval 30\n")


def test_an_alias_from_an_included_file_resolves(lab):
    r = resolve(lab, "labnode1")
    assert (r.get("hostname"), r.get("port"), r.get("user"), r.get("proxyjump")) == \
        ("10.1.2.3", "2222", "labuser", "jumpy")
    assert r.values["identityfile"] == (str(lab.parent / ".ssh" / "lab_10.1.2.3"),)
    assert r.sources["hostname"].endswith("lab.conf:5") and r.sources["user"].endswith("lab.conf:2")
    assert resolve(lab, "unknown").get("user") == "fallback"  # Host * after the include


def test_first_value_wins_and_identity_files_accumulate(tmp_path):
    cfg = write(tmp_path / "config", "Host a\n  User first\n  IdentityFile /k1\nHost *\n  User second\n"
                                     "  IdentityFile /k2\n  Port 2200\n")
    r = resolve(cfg, "a")
    assert r.get("user") == "first" and r.values["identityfile"] == ("/k1", "/k2") and r.get("port") == "2200"


def test_negated_patterns_and_match_blocks(tmp_path):
    cfg = write(tmp_path / "config", "Host *.lab !bad.lab\n  User labber\n"
                                     "Match host 10.0.* user alice\n  Port 2022\n"
                                     "Match originalhost gw\n  HostName 10.0.0.1\n"
                                     "Match host 10.0.0.1\n  IdentityFile /gwkey\n")
    assert resolve(cfg, "x.lab").get("user") == "labber"
    assert resolve(cfg, "bad.lab").get("user") is None
    gw = resolve(cfg, "gw", user="alice")
    assert gw.get("hostname") == "10.0.0.1" and gw.values["identityfile"] == ("/gwkey",)  # after HostName
    assert gw.get("port") is None  # in order: when that Match was read, HostName was not set yet
    assert resolve(cfg, "10.0.0.5", user="alice").get("port") == "2022"
    assert resolve(cfg, "10.0.0.5", user="bob").get("port") is None


def test_conditional_include_applies_only_inside_its_block(tmp_path):
    write(tmp_path / "inc.conf", "User included\nHost *\n  Port 2999\n")
    cfg = write(tmp_path / "config", f"Host special\n  Include {tmp_path}/inc.conf\n")
    assert resolve(cfg, "special").get("user") == "included"
    assert resolve(cfg, "plain").get("user") is None and resolve(cfg, "plain").get("port") is None


def test_what_only_openssh_can_evaluate_is_flagged(tmp_path):
    cfg = write(tmp_path / "config", "Match exec \"test -e /nonexistent\"\n  User x\nHost *\n  Port 2\n")
    r = resolve(cfg, "a")
    assert "Match exec" in r.needs_openssh and "config:1" in r.needs_openssh


def test_pattern_lists():
    assert match_list("node1", ["node*"]) and not match_list("node1", ["node*,!node1"])
    assert match_list("NODE1", ["node?"]) and not match_list("node12", ["node?"])


MATCHES = ("Host *.lab !bad.lab\n  User labber\nMatch host 10.0.* user alice\n  Port 2022\n"
           "Match originalhost gw\n  HostName 10.0.0.1\nMatch host 10.0.0.1\n  IdentityFile /gwkey\n"
           "Host multi\n  ProxyCommand nc %h %p\n  ProxyJump ignored\n")


@pytest.mark.skipif(not HAVE_SSH, reason="no OpenSSH client here")
@pytest.mark.parametrize("config,alias,user", [
    ("lab", "labnode1", None), ("lab", "labnode7", "bob"), ("lab", "other", None), ("lab", "nowhere", None),
    ("matches", "gw", "alice"), ("matches", "10.0.0.5", "alice"), ("matches", "10.0.0.5", "bob"),
    ("matches", "bad.lab", None), ("matches", "x.lab", None), ("matches", "multi", None)])
def test_own_reading_agrees_with_ssh_G(lab, tmp_path, config, alias, user):
    cfg = lab if config == "lab" else write(tmp_path / "matches" / "config", MATCHES)
    ours = resolve(cfg, alias, user=user)
    theirs = from_openssh(openssh(cfg, alias, user), alias, ours, local_user="me", home=str(cfg.parent))
    defaults = {"hostname": alias, "port": "22"}
    for key in ("hostname", "port", "proxyjump", "proxycommand", "identityfile"):
        mine = ours.values.get(key) or ((defaults[key],) if key in defaults else None)
        assert mine == theirs.values.get(key), key
    if ours.get("user") is not None:
        assert ours.get("user") == theirs.get("user")


@pytest.mark.skipif(not HAVE_SSH, reason="no OpenSSH client here")
def test_ssh_G_evaluates_match_exec(tmp_path):
    cfg = write(tmp_path / "config", "Match exec \"true\"\n  HostName 10.7.7.7\n")
    ours = resolve(cfg, "a")
    theirs = from_openssh(openssh(cfg, "a"), "a", ours, home=str(tmp_path))
    assert ours.get("hostname") is None and theirs.get("hostname") == "10.7.7.7"
    assert theirs.sources["hostname"] == "ssh -G"


def test_inventory_values_win_and_say_so(lab):
    inv = parse_inventory("version: 1\nhosts:\n  - {name: n1, host: labnode1, user: me, port: 22}\n"
                          "job: {script: t.py}\n", str(lab.parent / "inv.yaml"))
    target = ssh_target(inv.hosts[0], lambda alias, user=None, port=None: resolve(lab, alias, user=user, port=port))
    assert (target.hostname, target.user, target.port) == ("10.1.2.3", "me", 22)
    assert [j.alias for j in target.jumps] == ["jumpy"]
    line = target.provenance()
    assert "user me (inventory)" in line and "hostname 10.1.2.3 (ssh config" in line and "lab.conf:5" in line
    assert os.path.basename(target.identity_files[0]) == "lab_10.1.2.3"


def test_an_include_loop_fails_at_once_as_ssh_would(tmp_path):
    """Issue 21: a file that includes itself (twice) made 131,071 reads and 21 s per lookup; now it is the
    error OpenSSH gives, at once, naming the file and line, and no file in the chain is read twice."""
    import time as _time

    from clusterrun.errors import UsageError

    cfg = write(tmp_path / "config", f"Include {tmp_path}/config\nInclude {tmp_path}/config\nHost a\n  User u\n")
    reads = []
    t0 = _time.monotonic()
    with pytest.raises(UsageError) as info:
        read_config("a", files=((str(cfg), False),), read=lambda p: reads.append(p) or open(p).read())
    assert _time.monotonic() - t0 < 1 and len(reads) == 1
    assert f"{cfg}:1: Include" in str(info.value) and "too many recursive configuration includes" in str(info.value)


def test_includes_nest_as_deep_as_sshs_limit_and_no_deeper(tmp_path):
    from clusterrun.config.ssh_config import MAX_INCLUDE_DEPTH
    from clusterrun.errors import UsageError

    def chain(n):
        for i in range(n):
            write(tmp_path / f"c{i}", f"Include {tmp_path}/c{i + 1}\n")
        write(tmp_path / f"c{n}", "Host *\n  User deep\n")
        return tmp_path / "c0"

    assert read_config("x", files=((str(chain(MAX_INCLUDE_DEPTH)), False),)).get("user") == "deep"
    with pytest.raises(UsageError, match="more than 16 files deep"):
        read_config("x", files=((str(chain(MAX_INCLUDE_DEPTH + 1)), False),))


def test_match_exec_without_an_openssh_client_is_a_warning_not_a_silent_false(tmp_path, monkeypatch, caplog):
    import logging

    from clusterrun.transport import openssh

    cfg = write(tmp_path / "config", "Match exec \"test -d /\"\n  User fromexec\n")
    monkeypatch.setenv("CLUSTERRUN_SSH_CONFIG", str(cfg))
    monkeypatch.setattr(openssh.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="clusterrun.transport.openssh"):
        found = openssh.config_options()("somehost")
    assert found.get("user") is None
    assert any("Match exec" in r.getMessage() and "openssh-client" in r.getMessage() for r in caplog.records)
