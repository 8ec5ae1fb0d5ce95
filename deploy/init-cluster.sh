#!/bin/sh
# The compose cluster's key-generation step (docker-compose.yml, service "init"): each node's
# ed25519 key by ssh-keygen, its node.toml naming the others (their public keys inline, their relay
# URLs), its data folder and token, each in /cluster/<name>: the volume of that node's services
# only. Run again, it changes nothing.
#
# The defaults are the compose network's names; tests/compose runs the same file with host
# networking on loopback and sets the three variables.
set -eu
teaagent init --cluster alpha,beta,gamma /cluster \
    --host "${TEAAGENT_HOST:-relay-{name\}}" \
    --redis-url "${TEAAGENT_REDIS_URL:-redis://valkey:6379/0}" \
    --base-port "${TEAAGENT_BASE_PORT:-8700}" \
    --if-missing
# A node's folder is its own services' business: no other user in the container reads it.
chmod 700 /cluster/alpha /cluster/beta /cluster/gamma
