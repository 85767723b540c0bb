"""The container cluster's checked-in compose file is what `up` renders for the default cluster."""

from pathlib import Path

import testcluster
from testcluster.common import DEFAULT_HOSTS, DEFAULT_NAME, DEFAULT_SUBNET

COMPOSE = Path(__file__).resolve().parents[2] / "docker" / "compose.yaml"


def test_checked_in_compose_file_is_the_default_clusters_rendering():
    rendered = testcluster.Cluster(DEFAULT_NAME, hosts=DEFAULT_HOSTS, subnet=DEFAULT_SUBNET).compose_yaml()
    assert COMPOSE.read_text() == rendered, "docker/compose.yaml is stale: write Cluster('demo').compose_yaml() to it"


def test_compose_file_holds_nothing_of_this_machine():
    text = COMPOSE.read_text()
    assert "/work/" not in text and "/root/" not in text and "ssh-ed25519" not in text
    for variable in ("${CR_IMAGE", "${CR_AUTHORIZED_KEYS}", "${CR_STATE_DIR"):
        assert variable in text
