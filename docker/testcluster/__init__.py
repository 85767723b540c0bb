"""A cluster of docker containers posing as SSH hosts, to try and to test clusterrun on one machine.

    python docker/testcluster up [--hosts N] [--name NAME] [--subnet 198.18.200.0/24]
    python docker/testcluster status [--name NAME] [--json]
    python docker/testcluster ssh [--name NAME] node1 [COMMAND...]
    python docker/testcluster down [--name NAME]
    python docker/testcluster build [--force]        # the image only (CI warms its cache with it)
    python docker/testcluster clean [--all]          # remove the images (and the base image)

`up` builds the image when its inputs changed (otherwise it is reused as is), starts N hosts named
node0..node{N-1} at .10+i of the subnet, waits until each accepts a real SSH login with the test key
under strict host-key checking, and writes `.cluster/NAME/`: id_ed25519(.pub), known_hosts,
docker-compose.yml (for the default cluster, the same as docker/compose.yaml), inventory.yaml
(clusterrun's inventory format v1), ssh_config, state.json, and the directory `shared/` that every host
mounts at /shared.

From Python (the tests put docker/ on sys.path and `import testcluster`): ``Cluster(name).up()``, then
``exec``, ``processes``, ``orphans`` and the faults ``crash``/``start``, ``pause``/``unpause``,
``partition``/``heal``, ``block``/``unblock``, ``loopback_name``/``own_name`` (the host's name on 127.0.1.1
in its /etc/hosts), ``shape``/``unshape`` (tc tbf on an interface), and ``restore()`` to undo all of them.
``Cluster(name, second_subnet=...)`` (``up --second-subnet``) gives every host a second interface on a
second network (``HostInfo.address2``). Stdlib only
(PyYAML, when present, double-checks the inventory).

Modules: common (constants, records, the error), dockercli (docker and compose clients), image (base,
wheelhouse, build), cluster (lifecycle, readiness, processes), faults, render (compose file, inventory,
ssh_config), cli.
"""

from .cluster import Cluster
from .common import USER, ClusterError, HostInfo, Proc
from .dockercli import docker_bin, docker_unavailable_reason
from .image import build_image

__all__ = ["Cluster", "ClusterError", "HostInfo", "Proc", "USER", "build_image", "docker_bin", "docker_unavailable_reason"]
