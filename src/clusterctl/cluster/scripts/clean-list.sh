#!/bin/sh
# clean-list.sh CODE_DIR: what clusterctl left on this node, one line each, for
# `clusterctl clean` (cluster/clean.py) to decide on; nothing is changed here.
#   now EPOCH                       the node's clock
#   trees DIR                       the code trees' directory (no line: the node has none)
#   tree HEX KIB MTIME              a code tree (sync's trees/<64 hex>/), its disk use and last use
#   login NAME KIB MTIME SOCKETS    a kept-login directory (/tmp/clusterctl-mux.*, the tree's)
#   container JSON                  every container (any state): its inspect, one line
#   image JSON                      every image clusterctl made (label io.clusterctl.target)
#   engine-error WHAT               the runtime did not answer (its words on stderr; exit 3)
set -u
d=$1
# shellcheck disable=SC2088 # a literal ~/ from the inventory, expanded here by hand
case $d in "~/"*) d=$HOME/${d#"~/"};; esac
echo "now $(date +%s)"
if [ -d "$d/trees" ] && cd -P -- "$d/trees" 2>/dev/null; then
  echo "trees $(pwd -P)"
  find . -mindepth 1 -maxdepth 1 -type d -name '????????????????????????????????????????????????????????????????' |
    while read -r x; do
      x=${x#./}
      case $x in *[!0-9a-f]*) continue ;; esac
      printf 'tree %s %s %s\n' "$x" "$(du -sk -- "$x" | cut -f1)" "$(stat -c %Y -- "$x")"
    done
fi
find /tmp -maxdepth 1 -type d -name 'clusterctl-mux.*' -user "$(id -u)" 2>/dev/null |
  while read -r x; do
    n=${x#/tmp/}
    case $n in *[!A-Za-z0-9._-]*) continue ;; esac
    printf 'login %s %s %s %s\n' "$n" "$(du -sk -- "$x" 2>/dev/null | cut -f1)" \
      "$(stat -c %Y -- "$x")" "$(find "$x" -type s 2>/dev/null | wc -l)"
  done
# shellcheck disable=SC2086 # $CONTAINERS: the runtime's argv the head puts here, words on purpose
ids=$($CONTAINERS) || { echo "engine-error listing the containers"; exit 3; }
if [ -n "$ids" ]; then
  # shellcheck disable=SC2086 # $INSPECT_CONTAINERS: the runtime's argv; $ids: one word an ID
  out=$($INSPECT_CONTAINERS $ids) || { echo "engine-error inspecting the containers"; exit 3; }
  printf '%s\n' "$out" | sed 's/^/container /'
fi
# shellcheck disable=SC2086 # $IMAGES: the runtime's argv the head puts here
ids=$($IMAGES) || { echo "engine-error listing the images"; exit 3; }
if [ -n "$ids" ]; then
  # shellcheck disable=SC2086 # $INSPECT_IMAGES: the runtime's argv; $ids: one word an ID
  out=$($INSPECT_IMAGES $ids) || { echo "engine-error inspecting the images"; exit 3; }
  printf '%s\n' "$out" | sed 's/^/image /'
fi
exit 0
