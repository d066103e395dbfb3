#!/bin/sh
# $RT: the node's container runtime (docker, podman), set by the head before the script
: "${RT:=docker}"

# $4: the run's secret variable names as NAME|NAME (identifiers, checked by the head; may
# be empty). Of each container only what the head reads leaves the node: a JSON line of its
# name, state and labels, then one JSON string line per variable of those names (for masking
# its output); no other variable, mount, command or setting.
t=$1 label=$2 grace=$3 names=$4
fields='{"Name":{{json .Name}},"State":{{json .State}},"Config":{"Labels":{{json .Config.Labels}}}}{{println}}{{range .Config.Env}}{{json .}}{{println}}{{end}}'
keep='^[{]"Name":'
[ -z "$names" ] || keep="$keep|^\"($names)="
inspect() {
  # shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
  out=$("$RT" inspect --type container --format "$fields" $ids) || return 3
  printf '%s\n' "$out" | grep -E "$keep"
  return 0
}
ids=$("$RT" ps -a -q --no-trunc --filter "$label") || exit 3
[ -n "$ids" ] || exit 0
printf '@@%s before\n' "$t"
inspect || exit 3
# shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
"$RT" stop --time "$grace" $ids > /dev/null
for c in $ids; do printf '@@%s logs %s\n' "$t" "$c"; "$RT" logs --timestamps "$c" 2>&1; done
printf '@@%s after\n' "$t"
inspect
# shellcheck disable=SC2086 # $ids: the run's container IDs (hex), one word each on purpose
if err=$("$RT" rm --force $ids 2>&1 > /dev/null); then printf '@@%s removed\n' "$t"
else printf '@@%s rm-failed %s\n' "$t" "$(printf '%s\n' "$err" | tail -n 1)"; fi
