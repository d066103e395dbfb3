#!/bin/sh

out=$(docker image inspect --format '{{.Id}}' "$1" 2>&1); rc=$?
if [ "$rc" = 0 ] && [ "$out" = "$1" ]; then
  [ -z "$2" ] || docker tag "$1" "$2" || exit
  echo have; exit 0
fi
if [ "$rc" != 0 ]; then
  case "$out" in *[Nn]"o such image"*) ;; *) printf '%s\n' "$out" >&2; exit "$rc" ;; esac
fi
ids=$(docker image ls -a -q --no-trunc | sort -u) || exit
if command -v zstd > /dev/null; then echo lack zstd; else echo lack; fi
# shellcheck disable=SC2086 # $ids: every image's ID (hex), one word each on purpose
[ -z "$ids" ] || docker image inspect --format '{{json .RootFS.Layers}}' $ids || :
