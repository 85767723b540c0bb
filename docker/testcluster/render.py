"""The files a cluster is described by: its compose file, clusterrun's inventory for it, an ssh_config
(a mixin of Cluster: needs name, hosts, subnet, network and the state paths)."""

from __future__ import annotations

import json
import re
from typing import Mapping

from .common import CONTAINER_PYTHON, LABEL, MASTER_PORT, REPO_ROOT, USER, ClusterError, commands


class Rendering:
    def compose_yaml(self) -> str:
        """The compose file (format 2.4, understood by compose v1 and v2). JSON strings are YAML.

        Nothing in it depends on this machine: the image, the test key and the state folder come from
        the environment `up` runs compose with (compose_env), so docker/compose.yaml, the default
        cluster's rendering, is checked in as it is.
        """
        q = json.dumps
        gateway = str(self.subnet.network_address + 1)
        state = "${CR_STATE_DIR:-../.cluster/" + self.name + "}"
        out = [f"# The container cluster {self.name!r} as `python docker/testcluster up --name {self.name}` renders it",
               "# into .cluster/NAME/docker-compose.yml; run it through that command (it sets CR_IMAGE, the test key",
               "# and CR_STATE_DIR, and waits for SSH logins).",
               'version: "2.4"', "services:"]
        for h in self.hosts:
            others = [f"{o.name}:{o.address}" for o in self.hosts if o is not h]
            out += [
                f"  {h.name}:",
                '    image: "${CR_IMAGE:-clusterrun/host:latest}"',
                f"    container_name: {q(h.container)}",
                f"    hostname: {q(h.name)}",
                f"    labels: {{{q(LABEL)}: {q(self.name)}, {q(LABEL + '.host')}: {q(h.name)}}}",
                '    environment: {CR_AUTHORIZED_KEYS: "${CR_AUTHORIZED_KEYS}"}',
                "    volumes:",
                f"      - {q(state + '/shared:/shared')}",
                f"      - {q(state + '/hostkeys:/clusterrun/hostkeys')}",
                "    networks:",
                f"      cluster: {{ipv4_address: {q(h.address)}, aliases: [{q(h.name)}]}}",
                *([f"      second: {{ipv4_address: {q(h.address2)}}}"] if self.subnet2 else []),
                f"    extra_hosts: {q(others)}",
                "    cap_add: [NET_ADMIN]  # for block(): a blackhole route between two hosts",
                # a small disk for disk-full tests: 4 MB and 200 inodes, owned by cr
                f"    tmpfs: [{q('/small:size=4m,nr_inodes=200,uid=1000,gid=1000,mode=0700')}]",
                "    stop_grace_period: 1s",
            ]
        out += [
            "networks:",
            "  cluster:",
            f"    name: {q(self.network)}",
            "    driver: bridge",
            f"    labels: {{{q(LABEL)}: {q(self.name)}}}",
            "    ipam:",
            f"      config: [{{subnet: {q(str(self.subnet))}, gateway: {q(gateway)}}}]",
        ]
        if self.subnet2 is not None:  # a second NIC on every host (the network tests)
            out += ["  second:", f"    name: {q(self.network2)}", "    driver: bridge",
                    f"    labels: {{{q(LABEL)}: {q(self.name)}}}", "    ipam:",
                    f"      config: [{{subnet: {q(str(self.subnet2))}, "
                    f"gateway: {q(str(self.subnet2.network_address + 1))}}}]"]
        return "\n".join(out) + "\n"

    def compose_env(self, image: str) -> dict:
        """What compose_yaml leaves to the environment: the image, the test key, the state folder; and room
        for compose v1's threads: a service's `up` and its container's creation take one slot each of one
        shared limit (64 by default), so above 64 hosts every slot went to a service waiting for its
        container, and `up` hung for good (at 128 hosts: 29 containers, then nothing)."""
        return {"CR_IMAGE": image, "CR_AUTHORIZED_KEYS": self.key_path.with_suffix(".pub").read_text().strip(),
                "CR_STATE_DIR": str(self.state_dir), "COMPOSE_PARALLEL_LIMIT": str(max(64, 2 * len(self.hosts) + 8))}

    def inventory_data(self) -> dict:
        return {
            "version": 1,
            "defaults": {
                "user": USER,
                "port": 22,
                "identity_file": str(self.key_path),
                "known_hosts": str(self.known_hosts_path),
                "host_key_policy": "strict",
                "python": CONTAINER_PYTHON,
                "workdir": "~/.clusterrun",
                "connection": "ssh",
                "env": {"OMP_NUM_THREADS": "1"},
            },
            "hosts": [{"name": h.name, "host": h.address} for h in self.hosts],
            "master": {"port": MASTER_PORT},
            "job": {
                "root": str(REPO_ROOT),
                "script": "train_job/train.py",
                "args": ["--epochs", "1", "--synthetic", "--data-dir", "data"],
                "sync": ["train_job/"],
                "init_method": "env",
                "backend": "gloo",
                "timeout": "5m",
                "shared_dir": "/shared",
            },
        }

    def inventory_yaml(self) -> str:
        """clusterrun's inventory v1 for this cluster, laid out as people write it."""
        d = self.inventory_data()

        def s(v) -> str:
            if isinstance(v, bool) or v is None:
                raise TypeError(v)
            if isinstance(v, int):
                return str(v)
            if isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_./~][A-Za-z0-9_./~-]*", v) \
                    and not re.fullmatch(r"[0-9.]+|~|true|false|yes|no|on|off|null", v, re.I):
                return v
            return json.dumps(v)

        def flow(m: Mapping) -> str:
            return "{" + ", ".join(f"{k}: {s(v)}" for k, v in m.items()) + "}"

        dd, job = d["defaults"], d["job"]
        lines = [
            f"# Generated by `testcluster up --name {self.name}` (docker/testcluster) for its container cluster.",
            f"# Try: {commands(absolute=True)['clusterrun']} launch {self.inventory_path}",
            "version: 1",
            "defaults:",
        ]
        for k, v in dd.items():
            lines.append(f"  {k}: {flow(v) if isinstance(v, dict) else s(v)}")
        lines.append("hosts:")
        for h in d["hosts"]:
            # The address may look like a number to a careless reader, so quote nothing but check below.
            lines.append(f"  - {{name: {s(h['name'])}, host: {h['host']}}}")
        lines.append(f"master: {flow(d['master'])}")
        lines.append("job:")
        for k, v in job.items():
            if isinstance(v, list):
                lines.append(f"  {k}: [{', '.join(json.dumps(x) if k == 'args' else s(x) for x in v)}]")
            else:
                lines.append(f"  {k}: {s(v)}")
        text = "\n".join(lines) + "\n"
        try:
            import yaml  # the contract is the data, not the layout: make sure they agree
        except ImportError:
            return text
        if yaml.safe_load(text) != d:
            raise ClusterError(f"internal: the inventory text does not load back as written:\n{text}")
        return text

    def ssh_config(self) -> str:
        """For people: `ssh -F .cluster/NAME/ssh_config node1`."""
        out = [f"# Generated by docker/testcluster for cluster {self.name!r}."]
        for h in self.hosts:
            out += [f"Host {h.name} {h.address}", f"  HostName {h.address}", f"  User {USER}",
                    f"  IdentityFile {self.key_path}", "  IdentitiesOnly yes",
                    f"  UserKnownHostsFile {self.known_hosts_path}", "  StrictHostKeyChecking yes", ""]
        return "\n".join(out)
