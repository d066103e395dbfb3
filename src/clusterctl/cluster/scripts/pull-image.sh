#!/bin/sh
# $RT: the node's container runtime (docker, podman), set by the head before the script
: "${RT:=docker}"

set -eu
ref=$1
if [ "$2" = 1 ]; then
  d=$(mktemp -d "${TMPDIR:-/tmp}/clusterctl-pull.XXXXXX")   # named: a leftover says whose it is
  trap 'rm -rf "$d"' EXIT HUP INT TERM
  chmod 700 "$d"
  (umask 077 && cat > "$d/config.json")
  # docker reads $DOCKER_CONFIG/config.json, Podman $REGISTRY_AUTH_FILE (the same JSON)
  DOCKER_CONFIG=$d REGISTRY_AUTH_FILE=$d/config.json "$RT" pull --quiet "$ref" >/dev/null
else
  "$RT" pull --quiet "$ref" >/dev/null
fi
id=$("$RT" image inspect --format '{{.Id}}' "$ref")
echo "sha256:${id#sha256:}"   # Podman prints bare hex
