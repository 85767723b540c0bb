"""Fixtures of the unit lane."""

import os
import shutil
import tempfile

import pytest

from clusterrun.config.inventory import Timeouts
from clusterrun.hosts.client import HostClient
from clusterrun.transport.local import LocalTransport
from hostkit import make_host


@pytest.fixture
def host_client(tmp_path):
    """A HostClient for a `connection: local` host whose workdir is tmp_path/work (the real host program,
    real processes, no network)."""
    client = HostClient(make_host(tmp_path / "work"), LocalTransport("here"), Timeouts(command=20))
    yield client
    client.close()


@pytest.fixture
def shared_tmp():
    """A folder a second unix user reaches too (otheruser.py; pytest's tmp_path is this user's alone):
    0755, removed afterwards."""
    path = tempfile.mkdtemp(prefix="clusterrun-sec-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
