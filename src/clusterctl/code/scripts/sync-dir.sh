#!/bin/sh
# The start of sync-apply.sh and sync-probe.sh (sync.py sends this text before either):
# the code directory ($1, the inventory's code_dir) made when missing, and its trees/ used
# only when it is a real directory of the connecting user's, writable by no one else: a
# tree is found by its digest's name, so one that another user could write into could hold
# a planted tree under the name of the next launch's.
set -eu
d=$1
# shellcheck disable=SC2088 # a literal ~/ from the inventory, expanded here by hand
case $d in "~/"*) d=$HOME/${d#"~/"};; esac
mkdir -p -- "$d/trees"
if [ -L "$d/trees" ] || [ ! -d "$d/trees" ] || [ ! -O "$d/trees" ]; then
  echo "clusterctl: $d/trees is not a directory of this user's ($(id -un)): code trees there could have been written by another user; set the inventory's code_dir to a directory of your own" >&2
  exit 4
fi
chmod go-w -- "$d/trees"
cd -- "$d/trees"
