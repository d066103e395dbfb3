#!/bin/sh
case "$1" in /tmp/clusterctl-mux.*) if [ -d "$1" ] && [ ! -L "$1" ]; then
    # shellcheck disable=SC2095 # ssh -O exit only talks to the control socket: it never reads stdin
    find "$1" -maxdepth 1 -type s | while read -r s; do
      ssh -F /dev/null -o ControlPath="$s" -O exit clusterctl-tree > /dev/null 2>&1; done
    rm -rf "$1"; fi ;; esac
