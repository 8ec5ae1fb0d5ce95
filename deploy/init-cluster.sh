#!/bin/sh
# The compose cluster's key-generation step (docker-compose.yml, service "init"): each node's
# ed25519 key by ssh-keygen, its node.toml naming the others, its data folder and token, all in
# /cluster (a named volume shared by the node's services). Run again, it changes nothing.
set -eu
exec teaagent init --cluster alpha,beta,gamma /cluster \
    --host 'relay-{name}' \
    --redis-url redis://valkey:6379/0 \
    --base-port 8700 \
    --if-missing
