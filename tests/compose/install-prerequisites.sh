#!/bin/sh
# What `make test-compose` needs, installed from Debian's packages when missing: a Docker engine
# (started privately by the test, never as the host's service), Compose v1 (Debian bookworm has no
# Compose v2) and debootstrap for the base image.
set -eu
missing=""
command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
command -v containerd >/dev/null 2>&1 || missing="$missing containerd"
command -v runc >/dev/null 2>&1 || missing="$missing runc"
command -v docker-compose >/dev/null 2>&1 || missing="$missing docker-compose"
command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
if [ -n "$missing" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "make test-compose needs$missing: install them (apt-get install$missing) or run as root." >&2
        exit 2
    fi
    echo "installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # policy-rc.d: the package must not start the host's own Docker service; the test starts its own.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
