#!/bin/sh
# path-check.sh TOP PATH: whether clusterctl may act on PATH (a directory it derived under
# TOP, e.g. a run's under /var/tmp/clusterctl/runs) on a node other users share. Each part
# of PATH below TOP that exists must be a real directory (not a link), owned by root or by
# this login user, and writable by no one else unless sticky: otherwise another user could
# have put it there, or could swap what is under it, and an `rm -rf` of PATH would act on
# their choice. Prints the first part that fails and why, exit 4; nothing, exit 0.
top=$1 path=$2
case $path in "$top"/?*) ;; *) echo "$path is not under $top"; exit 4 ;; esac
me=$(id -u)
cur=$top
rest=${path#"$top"/}
while [ -n "$rest" ]; do
  part=${rest%%/*}
  case $rest in */*) rest=${rest#*/} ;; *) rest= ;; esac
  [ -n "$part" ] || continue
  case $part in .|..) echo "$path names $part"; exit 4 ;; esac
  cur=$cur/$part
  if [ -L "$cur" ]; then echo "$cur is a symbolic link"; exit 4; fi
  [ -e "$cur" ] || exit 0
  if [ ! -d "$cur" ]; then echo "$cur is not a directory"; exit 4; fi
  owner=$(stat -c %u -- "$cur") mode=$(stat -c %a -- "$cur")
  if [ "$owner" != 0 ] && [ "$owner" != "$me" ]; then
    echo "$cur belongs to another user (uid $owner)"; exit 4
  fi
  m=$(( 0$mode ))
  if [ $(( m & 0022 )) -ne 0 ] && [ $(( m & 01000 )) -eq 0 ]; then
    echo "$cur may be written by others (mode $mode, not sticky)"; exit 4
  fi
done
exit 0
