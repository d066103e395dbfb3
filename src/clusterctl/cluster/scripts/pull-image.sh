#!/bin/sh

set -eu
ref=$1
if [ "$2" = 1 ]; then
  d=$(mktemp -d)
  trap 'rm -rf "$d"' EXIT HUP INT TERM
  chmod 700 "$d"
  (umask 077 && cat > "$d/config.json")
  DOCKER_CONFIG=$d docker pull --quiet "$ref" >/dev/null
else
  docker pull --quiet "$ref" >/dev/null
fi
docker image inspect --format '{{.Id}}' "$ref"
