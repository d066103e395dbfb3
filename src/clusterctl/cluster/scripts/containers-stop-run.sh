#!/bin/sh
# $RT: the node's container runtime (docker, podman), set by the head before the script
: "${RT:=docker}"

t=$1 label=$2 grace=$3
ids=$("$RT" ps -a -q --no-trunc --filter "$label") || exit 3
[ -n "$ids" ] || exit 0
printf '@@%s before\n' "$t"
# shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
"$RT" inspect --type container $ids || exit 3
# shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
"$RT" stop --time "$grace" $ids > /dev/null
for c in $ids; do printf '@@%s logs %s\n' "$t" "$c"; "$RT" logs --timestamps "$c" 2>&1; done
printf '@@%s after\n' "$t"
# shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
"$RT" inspect --type container $ids
# shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
if err=$("$RT" rm --force $ids 2>&1 > /dev/null); then printf '@@%s removed\n' "$t"
else printf '@@%s rm-failed %s\n' "$t" "$(printf '%s\n' "$err" | tail -n 1)"; fi
