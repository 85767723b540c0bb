#!/bin/sh
# Make a Debian 12 machine ready for the integration lane (run as root from the repo root):
# docker + compose + debootstrap + ssh client installed, dockerd answering, the 198.18.0.0/15
# blackhole route in place, and the host image built (a no-op when its inputs have not changed).
#   PYTHON=.venv/bin/python sh docker/ci-prepare.sh   (as another user it runs itself again through sudo)
set -eu
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo PYTHON="${PYTHON:-}" sh docker/ci-prepare.sh "$@"
    fi
    echo "ci-prepare: run as root (it installs packages and starts dockerd); there is no sudo here" >&2
    exit 1
fi

missing=""
for pkg in docker.io docker-compose debootstrap openssh-client iproute2 procps; do
    dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
    echo "ci-prepare: installing$missing" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$missing >/dev/null
fi

# No systemd here: start dockerd ourselves when nothing answers (it is ready in well under a second).
if ! docker info >/dev/null 2>&1; then
    echo "ci-prepare: starting dockerd (log: /var/log/clusterrun-dockerd.log)" >&2
    nohup dockerd >/var/log/clusterrun-dockerd.log 2>&1 </dev/null &
    i=0
    until docker info >/dev/null 2>&1; do
        i=$((i + 1))
        if [ "$i" -gt 300 ]; then
            tail -20 /var/log/clusterrun-dockerd.log >&2
            echo "ci-prepare: dockerd did not answer in 30 s" >&2
            exit 1
        fi
        sleep 0.1
    done
fi

# Test traffic stays on this machine even while a cluster network is down.
ip route add blackhole 198.18.0.0/15 2>/dev/null || ip route show type blackhole | grep -q '198.18.0.0/15'

if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
"$PYTHON" docker/testcluster build -q >/dev/null
echo "ci-prepare: ready ($(docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' clusterrun/host:latest))" >&2
