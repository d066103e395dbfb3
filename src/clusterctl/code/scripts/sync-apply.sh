#!/bin/sh
# After sync-dir.sh (in the code directory's trees/). $RT: the node's container runtime.
set -eu
: "${RT:=docker}"
h=$2 b=$3 n=$4
if [ -d "$h" ]; then touch -- "$h"; cat >/dev/null; echo "present $(pwd -P)/$h"; exit 0; fi
if [ -n "$b" ] && [ ! -d "$b" ]; then cat >/dev/null; echo nobase; exit 3; fi
t=.tmp.$h.$$
trap 'rm -rf -- "$t"' EXIT
rm -rf -- "$t"
if [ -n "$b" ]; then cp -al -- "$b" "$t"; else mkdir -- "$t"; fi
if [ "$n" -gt 0 ]; then
  head -c "$n" | (cd -- "$t" && xargs -0 -r rm -rf --)
  find "$t" -mindepth 1 -depth -type d -empty -delete
fi
gzip -dc | tar -x -p --no-same-owner -C "$t" -f -
mv -T -- "$t" "$h" 2>/dev/null || [ -d "$h" ]
echo "added $(pwd -P)/$h"
# Past the newest $FIRST_UNKEPT - 1, a tree unused for a day goes, unless a container mounts
# it (a run launched more than a day ago may still run; a runtime that cannot answer keeps it).
here=$(pwd -P)
# shellcheck disable=SC2010,SC2086 # only the trees' 64-hex names are listed, newest first; $FIRST_UNKEPT: a number sync.py puts here
ls -t | grep -E '^[0-9a-f]{64}$' | tail -n +$FIRST_UNKEPT | while read -r x; do
  [ -n "$(find "$x" -maxdepth 0 -mmin +1440)" ] || continue
  if command -v "$RT" >/dev/null 2>&1; then
    used=$("$RT" ps -a -q --filter "volume=$here/$x" 2>/dev/null) || continue
    [ -z "$used" ] || continue
  fi
  rm -rf -- "$x"
done || true
find . -maxdepth 1 -name '.tmp.*' -mmin +60 -exec rm -rf -- {} + || true
