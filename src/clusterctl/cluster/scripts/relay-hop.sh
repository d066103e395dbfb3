#!/bin/sh

d=$1; t0=$(date +%s)
until [ -O "$d" ] && [ -p "$d/in" ]; do
  [ $(($(date +%s) - t0)) -ge 30 ] && { echo "no relay input at $d" >&2; exit 1; }
  sleep 0.05 2> /dev/null || sleep 1
done
cut -d" " -f5 /proc/$$/stat > "$d/hop"; exec cat > "$d/in"
