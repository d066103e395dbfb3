#!/bin/sh
set -eu
d=$1 h=$2
# shellcheck disable=SC2088 # a literal ~/ from the inventory, expanded here by hand
case $d in "~/"*) d=$HOME/${d#"~/"};; esac
mkdir -p -- "$d/trees"
cd -- "$d/trees"
if [ -d "$h" ]; then touch -- "$h"; echo "present $(pwd -P)/$h"; exit 0; fi
echo absent
# shellcheck disable=SC2010,SC2086 # only the trees' 64-hex names are listed, newest first; $KEEP: a number sync.py puts here
ls -t | grep -E '^[0-9a-f]{64}$' | head -n $KEEP || true
