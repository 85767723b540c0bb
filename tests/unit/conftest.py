"""Fixtures of the unit lane."""

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
