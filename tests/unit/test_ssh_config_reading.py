"""~/.ssh/config as OpenSSH reads it, piece by piece: Include, Host and Match blocks, first value wins, tokens,
the words of a line, canonicalization through a stub resolver, Match exec through a stub, the first jump's
own jumps, and what is refused (file:line and keyword). The whole against `ssh -G` itself:
test_ssh_config_differential.py."""

import os
import time

import pytest

from clusterrun.config.inventory import parse_inventory
from clusterrun.config.ssh_config import MAX_INCLUDE_DEPTH, from_openssh, match_list, read_config, ssh_target
from clusterrun.config.ssh_syntax import argv_split, match_pattern, parse_jump, percent_expand, strdelim
from clusterrun.errors import ConnectError, UsageError


def resolve(cfg, alias, **kw):
    return read_config(alias, files=((str(cfg), False),), local_user="me", home=str(cfg.parent), **kw)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def options_for(cfg, **kw):
    return lambda alias, user=None, port=None, jump=None: resolve(cfg, alias, user=user, port=port, jump=jump, **kw)


def inventory_host(tmp_path, host, **extra):
    fields = ", ".join(f"{k}: {v}" for k, v in {"name": "n1", "host": host, **extra}.items())
    return parse_inventory(f"version: 1\nhosts:\n  - {{{fields}}}\njob: {{script: t.py}}\n",
                           str(tmp_path / "inv.yaml")).hosts[0]


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
    assert r.identities == (str(lab.parent / ".ssh" / "lab_10.1.2.3"),)
    assert r.sources["hostname"].endswith("lab.conf:5") and r.sources["user"].endswith("lab.conf:2")
    assert resolve(lab, "unknown").get("user") == "fallback"  # Host * after the include
    assert r.jump.host == "jumpy" and r.jump.user is None


def test_first_value_wins_and_identity_files_accumulate_once_each(tmp_path):
    cfg = write(tmp_path / "config", "Host a\n  User first\n  IdentityFile /k1\nHost *\n  User second\n"
                                     "  IdentityFile /k2\n  IdentityFile /k1\n  Port 2200\n")
    r = resolve(cfg, "a")
    assert r.get("user") == "first" and r.identities == ("/k1", "/k2") and r.get("port") == "2200"
    assert resolve(cfg, "b").identities == ("/k2", "/k1")


def test_defaults_without_a_config(tmp_path):
    r = resolve(write(tmp_path / "config", ""), "Some.Host")
    assert (r.get("hostname"), r.get("user"), r.get("port"), r.identities) == ("some.host", "me", "22", None)
    assert r.sources == {}


def test_negated_patterns_and_match_blocks(tmp_path):
    cfg = write(tmp_path / "config", "Host *.lab !bad.lab\n  User labber\n"
                                     "Match host 10.0.* user alice\n  Port 2022\n"
                                     "Match originalhost gw\n  HostName 10.0.0.1\n"
                                     "Match host 10.0.0.1\n  IdentityFile /gwkey\n")
    assert resolve(cfg, "x.lab").get("user") == "labber"
    assert "user" not in resolve(cfg, "bad.lab").sources
    gw = resolve(cfg, "gw", user="alice")
    assert gw.get("hostname") == "10.0.0.1" and gw.identities == ("/gwkey",)  # Match host sees HostName once set
    assert gw.get("port") == "22"  # in order: when that Match was read, HostName was not set yet
    assert resolve(cfg, "10.0.0.5", user="alice").get("port") == "2022"
    assert resolve(cfg, "10.0.0.5", user="bob").get("port") == "22"


def test_host_patterns_are_case_sensitive_and_one_pattern_each(tmp_path):
    cfg = write(tmp_path / "config", "Host Node1\n  User upper\nHost web,db\n  User commas\n"
                                     "Match host WEB,db\n  Port 2001\n")
    assert "user" not in resolve(cfg, "node1").sources and resolve(cfg, "Node1").get("user") == "upper"
    assert "user" not in resolve(cfg, "web").sources and resolve(cfg, "web,db").get("user") == "commas"
    assert resolve(cfg, "web").get("port") == resolve(cfg, "db").get("port") == "2001"  # Match: a list, any case


def test_conditional_include_applies_only_inside_its_block(tmp_path):
    write(tmp_path / "inc.conf", "User included\nHost *\n  Port 2999\n")
    cfg = write(tmp_path / "config", f"Host special\n  Include {tmp_path}/inc.conf\n")
    assert resolve(cfg, "special").get("user") == "included"
    assert resolve(cfg, "plain").sources == {}


def test_hostname_tokens_expand_once_and_port_takes_service_names(tmp_path):
    cfg = write(tmp_path / "config", "Host a\n  HostName %h.example.com\n  Port ssh\nHost b\n  HostName x%%y\n")
    assert (resolve(cfg, "a").get("hostname"), resolve(cfg, "a").get("port")) == ("a.example.com", "22")
    assert resolve(cfg, "b").get("hostname") == "x%y"


def test_identity_file_tokens_as_ssh_expands_them(tmp_path, monkeypatch):
    monkeypatch.setenv("CR_KEYS", "/keys")
    monkeypatch.setattr("socket.gethostname", lambda: "ctl.lab.example")
    cfg = write(tmp_path / "config", "Host *\n  HostName Node9.Example\n  User ru\n  Port 2022\n"
                                     "  HostKeyAlias kalias\n  IdentityFile ~/.ssh/%l_%L\n  IdentityFile %d/%n_%h_%k\n"
                                     "  IdentityFile ${CR_KEYS}/%r@%h:%p\n  IdentityFile ~/.ssh/%C\n  IdentityFile ~/%%\n")
    ids = resolve(cfg, "Web").identities
    home = str(tmp_path)
    assert ids[:3] == (f"{home}/.ssh/ctl.lab.example_ctl", f"{home}/Web_node9.example_kalias",
                       "/keys/ru@node9.example:2022")
    assert len(os.path.basename(ids[3])) == 40 and ids[4] == f"{home}/%"


def test_identity_file_none_means_no_key_files_at_all(tmp_path):
    cfg = write(tmp_path / "config", "Host a\n  IdentityFile none\n")
    assert resolve(cfg, "a").identities == () and resolve(cfg, "b").identities is None
    inv_host = inventory_host(tmp_path, "a")
    target = ssh_target(inv_host, options_for(cfg))
    assert target.identity_files == () and target.identity_explicit  # ssh-agent only, not the default keys
    assert "ssh-agent only" in target.provenance()


def test_words_of_a_line_as_openssh_splits_them():
    assert strdelim("User=bob") == ("User", "bob") and strdelim("Port = 22") == ("Port", "22")
    assert strdelim("Port==22") == ("Port", "=22") and strdelim('"User" bob') == ("User", "bob")
    assert argv_split("a#b # c") == ["a#b"] and argv_split("a'b'c \"d e\"") == ["abc", "d e"]
    assert argv_split("x\\ y 'z") is None and argv_split('"a\\"b"') == ['a"b']
    assert match_pattern("node12", "node*") and not match_pattern("Node1", "node?")


def test_tokens_and_jumps_as_openssh_parses_them():
    assert percent_expand("%h-%%-%p", {"h": "x", "p": "22"}) == "x-%-22"
    with pytest.raises(ValueError, match="unknown token %d"):
        percent_expand("%d", {"h": "x"})
    assert parse_jump("ssh://u;fp=x@gw:2222") == parse_jump("u@gw:2222")
    assert (parse_jump("a,b:2201").host, parse_jump("a,b:2201").port, parse_jump("a,b:2201").extra) == ("b", 2201, "a")
    assert parse_jump("[::1]:22").host == "::1" and parse_jump("none").none
    for bad in ("user@", "ssh://gw/path", "gw:%p", "a,,b"):
        with pytest.raises(ValueError):
            parse_jump(bad)
    assert match_list("NODE1", ["node?"]) and not match_list("node1", ["node*,!node1"])


def test_canonicalization_through_the_resolver_and_a_second_pass(tmp_path):
    table = {"node1.lab.example.": ("10.9.0.1", "node1.lab.example")}
    cfg = write(tmp_path / "config", "CanonicalizeHostname yes\nCanonicalDomains nope.example lab.example\n"
                                     "Host node1.lab.example\n  User labuser\n  Port 2201\n"
                                     "Match canonical\n  IdentityFile ~/.ssh/canon\n")
    asked = []
    r = resolve(cfg, "node1", resolve=lambda name: asked.append(name) or table.get(name))
    assert (r.get("hostname"), r.get("user"), r.get("port")) == ("node1.lab.example", "labuser", "2201")
    assert asked == ["node1.nope.example.", "node1.lab.example."] and r.identities == (f"{tmp_path}/.ssh/canon",)
    assert resolve(cfg, "node3", resolve=table.get).get("hostname") == "node3"  # falls back to the name
    dry = resolve(cfg, "node1")  # no resolver given: said, not guessed
    assert "canonicalization" in dry.needs_openssh and dry.get("hostname") == "node1"
    strict = write(tmp_path / "strict", "CanonicalizeHostname yes\nCanonicalDomains lab.example\n"
                                        "CanonicalizeFallbackLocal no\n")
    with pytest.raises(ConnectError, match='could not resolve host "nowhere"'):
        resolve(strict, "nowhere", resolve=table.get)


def test_addresses_are_canonical_as_ssh_writes_them(tmp_path):
    cfg = write(tmp_path / "config", "Host short\n  HostName 10.1\n")
    assert resolve(cfg, "short").get("hostname") == "10.0.0.1"  # what ssh connects to and looks up in known_hosts


def test_match_exec_runs_through_the_runner_with_its_tokens(tmp_path):
    cfg = write(tmp_path / "config", 'Match host web exec "check %h %n %p"\n  User execuser\n  IdentityFile ~/k\n'
                                     "Match exec never\n  Port 1\nHost web\n  HostName w1.example\n")
    ran = []
    r = resolve(cfg, "web", run_exec=lambda cmd: ran.append(cmd) or (0 if cmd.startswith("check") else 1))
    assert ran == ["check web web 22", "never"]  # HostName is read after that Match: %h is still the alias
    assert r.get("user") == "execuser" and r.identities == (f"{tmp_path}/k",) and r.get("port") == "22"
    later = []
    assert resolve(cfg, "db", run_exec=lambda cmd: later.append(cmd) or 1).get("user") == "me"
    assert later == ["never"]  # host web failed: its exec is not run
    assert "Match exec at" in resolve(cfg, "web").needs_openssh  # no runner: said, not guessed


def test_match_final_re_reads_with_the_host_name(tmp_path):
    cfg = write(tmp_path / "config", "Host web\n  HostName 10.0.0.7\nHost 10.0.0.7\n  User byaddr\nMatch final\n")
    assert resolve(cfg, "web").get("user") == "byaddr"


@pytest.mark.parametrize("text,keyword,why", [
    ("Host a\n  Foo bar\n", "foo", "Bad configuration option"),
    ("Host zzz\n  Foo bar\n", "foo", "Bad configuration option"),  # also where the block does not apply
    ("Host a\n  Port abc\n", "port", "bad port"),
    ("Host a\n  User a b\n", "user", "extra arguments"),
    ("Match foo bar\n", "match", "Unsupported Match attribute foo"),
    ('Host a\n  User "bob\n', "user", "invalid quotes"),
    ("Host a\n  HostName %p.example\n", "hostname", "unknown token %p"),
    ("Host a\n  Ciphers nonsense\n", "ciphers", "bad algorithm name"),
])
def test_a_config_ssh_refuses_is_refused_naming_file_line_and_keyword(tmp_path, text, keyword, why):
    cfg = write(tmp_path / "config", text)
    with pytest.raises(UsageError) as info:
        resolve(cfg, "a")
    assert f"{cfg}:2: {keyword}:" in str(info.value) or f"{cfg}:1: {keyword}:" in str(info.value)
    assert why in str(info.value)


def test_ignore_unknown_passes_over_the_keywords_it_names(tmp_path):
    cfg = write(tmp_path / "config", "IgnoreUnknown UseKeychain,Add*\nHost a\n  UseKeychain yes\n  User u\n")
    assert resolve(cfg, "a").get("user") == "u"


def test_the_first_jumps_own_jumps_come_first_and_later_hops_own_are_ignored(tmp_path):
    cfg = write(tmp_path / "config", "Host t\n  ProxyJump a,b\nHost a\n  ProxyJump outer\n  User au\n"
                                     "Host outer\n  ProxyCommand nc -x proxy %h %p\nHost b\n  ProxyJump ignored\n"
                                     "Host node*\n  ProxyJump gw-%h\n")
    target = ssh_target(inventory_host(tmp_path, "t"), options_for(cfg))
    assert [(j.alias, j.user) for j in target.jumps] == [("outer", "me"), ("a", "au"), ("b", "me")]
    assert target.jumps[0].proxy_command == "nc -x proxy outer 22" and target.proxy_command is None
    assert "(to reach the first jump)" in target.provenance()
    node = ssh_target(inventory_host(tmp_path, "node1"), options_for(cfg))
    assert [j.alias for j in node.jumps] == ["gw-node1"]  # ProxyJump takes ProxyCommand's tokens


def test_a_jump_loop_is_refused_at_once(tmp_path):
    cfg = write(tmp_path / "config", "Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n")
    t0 = time.monotonic()
    with pytest.raises(UsageError, match=r"lead back to themselves: a \(ProxyJump at .*config:2\) -> b"):
        ssh_target(inventory_host(tmp_path, "a"), options_for(cfg))
    assert time.monotonic() - t0 < 1


def test_a_jump_word_the_shell_would_split_is_refused(tmp_path):
    cfg = write(tmp_path / "config", 'Host a\n  User "two words"\n  ProxyJump %r@gw\n')
    with pytest.raises(UsageError, match="to the shell unquoted"):
        resolve(cfg, "a")


def test_inventory_values_win_and_say_so(lab, tmp_path):
    inv_host = inventory_host(tmp_path, "labnode1", user="me", port=22)
    target = ssh_target(inv_host, options_for(lab))
    assert (target.hostname, target.user, target.port) == ("10.1.2.3", "me", 22)
    assert [j.alias for j in target.jumps] == ["jumpy"]
    line = target.provenance()
    assert "user me (inventory)" in line and "hostname 10.1.2.3 (ssh config" in line and "lab.conf:5" in line
    assert os.path.basename(target.identity_files[0]) == "lab_10.1.2.3"


def test_the_inventorys_proxy_jump_is_sshs_minus_J(tmp_path):
    cfg = write(tmp_path / "config", "Host t\n  ProxyCommand nc %h %p\nHost g1\n  ProxyJump outer\n")
    target = ssh_target(inventory_host(tmp_path, "t", proxy_jump='"g1,g2"'), options_for(cfg))
    assert [j.alias for j in target.jumps] == ["outer", "g1", "g2"] and target.proxy_command is None


def test_an_include_loop_fails_at_once_as_ssh_would(tmp_path):
    """Issue 21: a file that includes itself (twice) made 131,071 reads and 21 s per lookup; now it is the
    error OpenSSH gives, at once, naming the file and line, and no file in the chain is read twice."""
    cfg = write(tmp_path / "config", f"Include {tmp_path}/config\nInclude {tmp_path}/config\nHost a\n  User u\n")
    reads = []
    t0 = time.monotonic()
    with pytest.raises(UsageError) as info:
        read_config("a", files=((str(cfg), False),), read=lambda p: reads.append(p) or open(p).read())
    assert time.monotonic() - t0 < 1 and len(reads) == 1
    assert f"{cfg}:1: Include" in str(info.value) and "too many recursive configuration includes" in str(info.value)


def test_includes_nest_as_deep_as_sshs_limit_and_no_deeper(tmp_path):
    def chain(n):
        for i in range(n):
            write(tmp_path / f"c{i}", f"Include {tmp_path}/c{i + 1}\n")
        write(tmp_path / f"c{n}", "Host *\n  User deep\n")
        return tmp_path / "c0"

    assert read_config("x", files=((str(chain(MAX_INCLUDE_DEPTH)), False),)).get("user") == "deep"
    with pytest.raises(UsageError, match="more than 16 files deep"):
        read_config("x", files=((str(chain(MAX_INCLUDE_DEPTH + 1)), False),))


def test_from_openssh_completes_what_ssh_G_prints(tmp_path, monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "ctl")
    printed = ("host web\nuser ru\nhostname 10.0.0.5\nport 2022\nidentityfile ~/.ssh/k_%h\nidentityfile none\n"
               "userknownhostsfile /kh/known /kh/known2\nproxyjump x,ju@[::1]:2200\n")
    r = from_openssh(printed, "web", read_config("web", files=()), home="/h")
    assert r.identities == ("/h/.ssh/k_10.0.0.5",) and r.get("userknownhostsfile") == "/kh/known"
    assert (r.jump.host, r.jump.user, r.jump.port, r.jump.extra) == ("::1", "ju", 2200, "x")
    assert r.sources["hostname"] == "ssh -G"
    defaults = printed.replace("identityfile ~/.ssh/k_%h\nidentityfile none\n", "".join(
        f"identityfile ~/.ssh/{k}\n" for k in ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk",
                                               "id_xmss", "id_dsa")))
    assert from_openssh(defaults, "web", read_config("web", files=())).identities is None  # ssh's defaults


class FakeSsh:
    """openssh.subprocess with an ssh that prints or refuses, and counts its runs."""

    DEVNULL = -3
    SubprocessError = OSError

    def __init__(self, rc=0, out="", err=""):
        self.rc, self.out, self.err, self.runs = rc, out, err, []

    def run(self, argv, **kw):
        import subprocess

        self.runs.append(argv)
        return subprocess.CompletedProcess(argv, self.rc, self.out, self.err)


def test_ssh_is_asked_only_where_the_config_has_a_say(tmp_path, monkeypatch):
    from clusterrun.transport import openssh

    cfg = write(tmp_path / "config", "Host a\n  User u\n")
    monkeypatch.setenv("CLUSTERRUN_SSH_CONFIG", str(cfg))
    monkeypatch.setattr(openssh.shutil, "which", lambda name: "/usr/bin/ssh")
    fake = FakeSsh(out="host a\nuser u\nhostname a\nport 22\n")
    monkeypatch.setattr(openssh, "subprocess", fake)
    options = openssh.config_options()
    assert options("elsewhere").get("user") and fake.runs == []  # nothing configured: no process
    assert options("a", jump="j1,j2").get("user") == "u"
    assert fake.runs == [["ssh", "-G", "-F", str(cfg), "-J", "j1,j2", "--", "a"]]


def test_a_config_ssh_refuses_is_refused_with_sshs_words(tmp_path, monkeypatch):
    from clusterrun.transport import openssh

    cfg = write(tmp_path / "config", "Host a\n  Frobnicate yes\n")
    monkeypatch.setenv("CLUSTERRUN_SSH_CONFIG", str(cfg))
    monkeypatch.setattr(openssh.shutil, "which", lambda name: "/usr/bin/ssh")
    said = f"{cfg}: line 2: Bad configuration option: frobnicate\n{cfg}: terminating, 1 bad configuration options\n"
    monkeypatch.setattr(openssh, "subprocess", FakeSsh(rc=255, err=said))
    with pytest.raises(UsageError) as info:
        openssh.config_options()("a")
    assert f"{cfg}: line 2: Bad configuration option: frobnicate" in str(info.value)
    assert f"{cfg}:2: frobnicate" in str(info.value)  # clusterrun's own reading names it too
    monkeypatch.setattr(openssh, "subprocess", FakeSsh(rc=255, err='ssh: Could not resolve host "x"\n'))
    with pytest.raises(ConnectError):
        openssh.config_options()("a")


def test_without_ssh_match_exec_runs_in_the_shell(tmp_path, monkeypatch):
    from clusterrun.transport import openssh

    cfg = write(tmp_path / "config", 'Match exec "test -d /"\n  User fromexec\nMatch exec false\n  Port 1\n')
    monkeypatch.setenv("CLUSTERRUN_SSH_CONFIG", str(cfg))
    monkeypatch.setattr(openssh.shutil, "which", lambda name: None)
    found = openssh.config_options()("somehost")
    assert (found.get("user"), found.get("port"), found.needs_openssh) == ("fromexec", "22", "")


def test_each_line_is_split_once_however_many_hosts_are_looked_up(tmp_path):
    """A launch looks every host up in the same files: a line's split (keyword, words) is pure and kept, so
    128 hosts cost one split of each distinct line; the lookups themselves stay each host's own."""
    from clusterrun.config.ssh_readconf import _tokens

    cfg = write(tmp_path / "config", "".join(f"Host n{i}\n  HostName 198.18.0.{i}\n  User u{i}\n" for i in range(40)))
    _tokens.cache_clear()
    found = [resolve(cfg, f"n{i}") for i in range(40)]
    assert [f.get("hostname") for f in found] == [f"198.18.0.{i}" for i in range(40)]
    assert [f.get("user") for f in found] == [f"u{i}" for i in range(40)]
    info = _tokens.cache_info()
    assert info.misses <= 3 * 40 + 2 and info.hits >= 39 * 3 * 40  # 120 distinct lines, each split once
