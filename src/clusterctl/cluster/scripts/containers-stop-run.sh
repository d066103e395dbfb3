#!/bin/sh

t=$1 label=$2 grace=$3
ids=$(docker ps -a -q --no-trunc --filter "$label") || exit 3
[ -n "$ids" ] || exit 0
printf '@@%s before\n' "$t"
# shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
docker inspect --type container $ids || exit 3
# shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
docker stop --time "$grace" $ids > /dev/null
for c in $ids; do printf '@@%s logs %s\n' "$t" "$c"; docker logs --timestamps "$c" 2>&1; done
printf '@@%s after\n' "$t"
# shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
docker inspect --type container $ids
# shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
if err=$(docker rm --force $ids 2>&1 > /dev/null); then printf '@@%s removed\n' "$t"
else printf '@@%s rm-failed %s\n' "$t" "$(printf '%s\n' "$err" | tail -n 1)"; fi
