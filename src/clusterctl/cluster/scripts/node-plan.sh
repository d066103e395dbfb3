#!/bin/sh
# $RT: the node's container runtime (docker, podman), set by the head before the script
: "${RT:=docker}"

out=$("$RT" image inspect --format '{{.Id}}' "$1" 2>&1); rc=$?
# Podman prints an image's ID as bare hex
if [ "$rc" = 0 ] && { [ "$out" = "$1" ] || [ "sha256:$out" = "$1" ]; }; then
  [ -z "$2" ] || "$RT" tag "$1" "$2" || exit
  echo have; exit 0
fi
if [ "$rc" != 0 ]; then
  case "$out" in *[Nn]"o such image"* | *"image not known"*) ;; *) printf '%s\n' "$out" >&2; exit "$rc" ;; esac
fi
if [ "$RT" = docker ]; then ids=$("$RT" image ls -a -q --no-trunc | sort -u) || exit; fi
if command -v zstd > /dev/null; then echo lack zstd; else echo lack; fi
# Podman is sent the whole image (no layer list): its load takes a complete archive only
[ "$RT" = docker ] || exit 0
# shellcheck disable=SC2086 # $ids: every image's ID (hex), one word each on purpose
[ -z "$ids" ] || "$RT" image inspect --format '{{json .RootFS.Layers}}' $ids || :
