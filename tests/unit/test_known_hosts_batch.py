"""accept-new at many hosts at once: the new keys go to known_hosts in a few writes (a group commit),
not one read-and-append of the whole file per host; each host still learns its own key's fate."""

import threading
import time

import paramiko
import pytest

from clusterrun.errors import HostKeyChanged
from clusterrun.transport import hostkeys
from clusterrun.transport.hostkeys import KnownHosts

KEY = paramiko.RSAKey.generate(1024)
OTHER = paramiko.RSAKey.generate(1024)


def verify_all(kh: KnownHosts, names, key=KEY):
    errors, gate = {}, threading.Barrier(len(names), timeout=10)

    def one(name):
        gate.wait()
        try:
            kh.verify(name, name, 22, key, "accept-new")
        except Exception as exc:
            errors[name] = exc

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return errors


def test_a_hundred_new_hosts_at_once_are_recorded_in_a_few_writes(tmp_path, monkeypatch):
    path = tmp_path / "known_hosts"
    real_flock, first = hostkeys.fcntl.flock, []

    def slow_first(fh, op):  # the first write takes a while: everyone else arrives meanwhile
        real_flock(fh, op)
        if not first:
            first.append(1)
            time.sleep(0.3)

    monkeypatch.setattr(hostkeys.fcntl, "flock", slow_first)
    kh = KnownHosts(str(path))
    names = [f"198.18.9.{i}" for i in range(100)]
    assert verify_all(kh, names) == {}
    assert kh.writes <= 3
    lines = path.read_text().splitlines()
    assert sorted(line.split()[0] for line in lines) == sorted(names)  # each once
    again = KnownHosts(str(path))
    for name in names:
        again.verify(name, name, 22, KEY, "strict")  # recorded for good


def test_a_key_another_process_recorded_meanwhile_fails_that_host_only(tmp_path):
    path = tmp_path / "known_hosts"
    kh = KnownHosts(str(path))  # read before the other process wrote
    path.write_text(f"198.18.9.7 {OTHER.get_name()} {OTHER.get_base64()}\n")
    errors = verify_all(kh, [f"198.18.9.{i}" for i in range(10)])
    assert list(errors) == ["198.18.9.7"] and isinstance(errors["198.18.9.7"], HostKeyChanged)
    assert len(path.read_text().splitlines()) == 10


def test_a_known_key_writes_nothing_and_a_changed_one_is_fatal(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text(f"198.18.9.1 {KEY.get_name()} {KEY.get_base64()}\n")
    kh = KnownHosts(str(path))
    kh.verify("a", "198.18.9.1", 22, KEY, "accept-new")
    assert kh.writes == 0
    with pytest.raises(HostKeyChanged):
        kh.verify("a", "198.18.9.1", 22, OTHER, "accept-new")
