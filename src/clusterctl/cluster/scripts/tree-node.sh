#!/bin/sh

d=$1 self=$2 key=$3 prog=$4 mux=${5:--} fin=${6:--}
case "$d" in /tmp/clusterctl-tree.*) ;; *) echo "not a tree directory: $d" >&2; exit 2 ;; esac
case "$mux" in -|/tmp/clusterctl-mux.*) ;; *) echo "not a tree directory: $mux" >&2; exit 2 ;; esac
set -f
umask 077
mkdir "$d" || { echo "could not make the tree's temporary directory $d" >&2; exit 1; }
hb=
trap '[ -z "$hb" ] || kill "$hb" 2>/dev/null; rm -rf "$d"' EXIT
trap 'exit 143' TERM
trap 'exit 129' HUP
# the session's end can reach this shell as SIGPIPE, which would skip the EXIT trap
trap 'exit 141' PIPE
req=$(cat)
{ trap '' PIPE
  # on stdout too: a parent's kept login (mux) that lost its caller shuts only this
  # session's stdout (OpenSSH's eow), where a closed connection shuts both
  # shellcheck disable=SC2086,SC2217,SC2015 # $HEARTBEAT: a number the head puts here; sleep's fds closed on purpose; either echo failing breaks
  while sleep $HEARTBEAT < /dev/null > /dev/null 2>&1 5>&-; do
    echo clusterctl-alive >&2 && echo clusterctl-alive >&5 || break; done
  kill -TERM 0; } < /dev/null 5>&1 > /dev/null &
hb=$!
close_mux() { $CLOSE_MUX
}
# a word for the remote shell: single-quoted, its quotes escaped (the hop's command line)
q() { [ -n "$1" ] || { printf "''"; return; }; printf '%s' "$1" | sed "s/'/'\\\\''/g; 1s/^/'/; \$s/\$/'/"; }
qkey=$(q "$key") qprog=$(q "$prog")
b64() { x=$(base64 | tr -d '\n'); printf '%s' "${x:--}"; }
# stdin -> "clusterctl-tree-$1 NAME $2 LEN CHUNK" lines, each written whole, at once
# shellcheck disable=SC2086 # $CHUNK: a number the head puts here
chunks() { base64 | tr -d '\n' | fold -w $CHUNK |
  awk -v p="clusterctl-tree-$1 $self $2 " '{ print p length($0) " " $0; fflush() }'; }
# whether the node at path $1 has nodes below it in this call
carries() { printf '%s\n' "$req" | awk -v p="$1" '{ if (index($2, p "/") == 1) f = 1 } END { exit !f }'; }
mine=$(printf '%s\n' "$req" | awk -v s="$self" '$1 == s')
[ -n "$mine" ] || { echo "no request for $self" >&2; exit 2; }
# shellcheck disable=SC2086 # the node's request line, split into words on purpose (set -f)
set -- $mine
path=$2
shift 8
# a directory of kept logins whose masters are all gone (its command was killed, or this
# node was cut off from it, before its close) goes once it is old: every tree call sweeps
# shellcheck disable=SC2086 # $MUX_SWEEP_MIN: a number the head puts here
find /tmp -maxdepth 1 -name 'clusterctl-mux.*' -user "$(id -u)" -mmin +$MUX_SWEEP_MIN \
  ! -path "$mux" 2>/dev/null | while read -r o; do
  [ -n "$(find "$o" -type s 2>/dev/null | head -n 1)" ] || rm -rf "$o"; done
# kept logins ($mux, a directory of this command's own, on a node with children): each
# hop's ssh is an OpenSSH control master that outlives this call (ControlPersist), so the
# command's next calls log in no more; the masters reach the agent of the call in
# progress through $mux/agent, a link each call points at its own forwarded socket.  The
# call marked "close" ends them and removes the directory.
agent=${SSH_AUTH_SOCK:-} muxo=
if [ "$mux" != - ] && carries "$path"; then
  # shellcheck disable=SC2015 # any step failing ends the command, as meant
  { mkdir "$mux" 2>/dev/null || [ -d "$mux" ]; } && [ ! -L "$mux" ] && [ -O "$mux" ] ||
    { echo "could not make the tree's directory $mux" >&2; exit 1; }
  if [ -z "$key" ] && [ -n "$agent" ]; then ln -sfn "$agent" "$mux/agent"; agent=$mux/agent; fi
  muxo="-o ControlMaster=auto -o ControlPath=$mux/%C -o ControlPersist=$MUX_PERSIST"
fi
k=0 pids=
while [ "$#" -ge 2 ]; do
  k=$((k+1))
  # fd 3: this program's own stdout, for a command that writes whole protocol lines itself
  # (a followed run's log stream: "clusterctl-tree-l" lines, as its lines come)
  # the argv arrives NUL-terminated (any bytes but NUL, as docker run takes them): xargs -0
  # hands it over unchanged; the command writes its own exit status (xargs would map it)
  ( a=$1 i=$2
    if [ "$i" = - ]; then in=/dev/null; else in="$d/in.$k"; mkfifo "$in" || exit 1
      printf '%s' "$i" | base64 -d > "$in" & fi
    # shellcheck disable=SC2016 # the inner sh expands these, not this one
    { printf '%s' "$a" | base64 -d | IN="$in" RC="$d/rc.$k" xargs -0 -x sh -c \
        '"$@" < "$IN"; echo $? > "$RC"' sh 2> "$d/err.$k"; } | chunks o $k
    [ -s "$d/rc.$k" ] || echo 127 > "$d/rc.$k"
    [ "$i" = - ] || kill $! 2>/dev/null
    [ ! -s "$d/err.$k" ] || chunks e $k < "$d/err.$k"
    printf 'clusterctl-tree-r %s %s %s .\n' "$self" "$k" "$(cat "$d/rc.$k")" ) < /dev/null 3>&1 &
  pids="$pids $!"
  shift 2
done
n=0
for child in $(printf '%s\n' "$req" | awk -v p="$path" '{ if (index($2, p "/") == 1 && index(substr($2, length(p) + 2), "/") == 0) print $1 }'); do
  n=$((n+1))
  # shellcheck disable=SC2046 # the child's request line, split into words on purpose (set -f)
  set -- $(printf '%s\n' "$req" | awk -v s="$child" '$1 == s')
  cpath=$2 cdir=$3 port=$4 user=$5 host=$6 cmux=$8
  printf '%s' "$7" | base64 -d > "$d/kh.$n"
  if carries "$cpath"; then
    fwd=yes; else fwd=no; fi
  # a kept login serves the command's next calls too, where this child may carry others
  [ -z "$muxo" ] || fwd=yes
  if [ -n "$key" ]; then
    auth="-o IdentitiesOnly=yes -o IdentityAgent=none -o ForwardAgent=no"; fwd=no
  else auth="-o ForwardAgent=$fwd"; fi
  [ "$TRACE" = 1 ] && echo "clusterctl-mark hop $child start" >&2
  # the hop's stderr (its ssh's words, the child's own) to a file without the child's
  # heartbeat, which would grow it by a line every $HEARTBEAT s for as long as a run is followed
  # shellcheck disable=SC2086 # $muxo, $auth: ssh options, one word each on purpose; $HOP_CONNECT_TIMEOUT, $HOP_KEX: what the head puts here
  { { { printf '%s\n' "$req" | awk -v p="$cpath" '$2 == p || index($2, p "/") == 1' |
          SSH_AUTH_SOCK=$agent ssh -F /dev/null -T -o BatchMode=yes -o StrictHostKeyChecking=yes \
            -o UserKnownHostsFile="$d/kh.$n" -o GlobalKnownHostsFile=/dev/null $muxo \
            -o ConnectTimeout=$HOP_CONNECT_TIMEOUT -o ServerAliveInterval=5 -o ServerAliveCountMax=3 \
            -o KexAlgorithms=$HOP_KEX -o ClearAllForwardings=yes -o LogLevel=ERROR $auth ${key:+-i "$key"} \
            -p "$port" -l "$user" -- "$host" \
            "sh -c $prog clusterctl-tree $cdir $child $qkey $qprog $cmux $fin"
        echo $? > "$d/hoprc.$n"; } 2>&1 >&4 | grep -v '^clusterctl-alive$' > "$d/hoperr.$n"
    } 4>&1 | grep --line-buffered '^clusterctl-tree-'
    rc=$(cat "$d/hoprc.$n")
    [ "$rc" = 0 ] || printf 'clusterctl-tree-hop %s %s %s .\n' "$child" "$rc" \
      "$(grep -v '^clusterctl-alive$' "$d/hoperr.$n" | tail -n 5 | b64)"
  } < /dev/null &
  pids="$pids $!"
done
# shellcheck disable=SC2086 # $pids: process IDs, one word each on purpose
wait $pids
[ "$fin" != close ] || [ "$mux" = - ] || close_mux "$mux"
kill "$hb" 2>/dev/null
exit 0
