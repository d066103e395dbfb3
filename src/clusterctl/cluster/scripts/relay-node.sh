#!/bin/sh
# $RT: the node's container runtime (docker, podman), set by the head before the script
: "${RT:=docker}"

d=$1; z=$2; fed=$3; id=$4; ref=$5; shift 5
case "$d" in /tmp/clusterctl-push.*) ;; *) exit 2 ;; esac
umask 077
mkdir "$d" || { echo "could not make the push's temporary directory $d" >&2; exit 1; }
trap 'rm -rf "$d"' EXIT
trap 'exit 143' TERM
trap 'exit 129' HUP
# the head's session gone, a write to stderr would end this shell without its EXIT trap
# (SIGPIPE's default), leaving $d behind: exit through the trap instead
trap 'exit 141' PIPE
cut -d' ' -f5 /proc/$$/stat > "$d/pgid"
mkfifo "$d/in" && : > "$d/known_hosts" && : > "$d/progress" || exit 1
# every 2 s: tell the head how far dd got; stop everything when the stream stalls for
# $STALL s before it is complete (a dead feeder or head) or the head's session is gone.
# The stall is measured on the clock, not in rounds of this loop: on a busy node a round
# takes longer than 2 s, and counting rounds let a stalled node wait minutes past $STALL.
{ trap '' PIPE
  last=-1; since=$(date +%s)
  # shellcheck disable=SC2217 # sleep's fds closed on purpose: it must not hold the head's session open
  while sleep 2 < /dev/null > /dev/null 2>&1; do
    now=$(wc -c < "$d/progress") || break
    t=$(date +%s) || break
    if [ "$now" != "$last" ] || grep -q "records out" "$d/progress"; then since=$t; last=$now; fi
    [ $((t - since)) -ge "$STALL" ] && break
    echo "clusterctl-alive $(tr '\r' '\n' < "$d/progress" | grep bytes | tail -n 1)" >&2 || break
  done
  kill -TERM 0; } < /dev/null > /dev/null &
hb=$!
outs=
i=0
while [ "$#" -ge 5 ]; do
  i=$((i+1))
  printf '%s\n' "$4" >> "$d/known_hosts"
  mkfifo "$d/out$i"
  # the hop's ssh logs in now, while the stream has not reached this node yet: "cat fifo |"
  # waits for tee, ssh does not, so every hop of a chain connects at the same time instead
  # of each one only once its feeder's hop is up (~1 s per hop, serial along the chain)
  # shellcheck disable=SC2002,SC2086 # cat waits for the fifo, ssh does not (see above); $HOP_KEX: a word the head puts here
  { cat "$d/out$i" | {
      [ "$TRACE" = 1 ] && echo "clusterctl-mark hop$i-ssh-start" >&2
      ssh -F /dev/null -T -o BatchMode=yes -o StrictHostKeyChecking=yes \
        -o UserKnownHostsFile="$d/known_hosts" -o GlobalKnownHostsFile=/dev/null \
        -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=3 \
        -o ForwardAgent=no -o KexAlgorithms=$HOP_KEX -o ClearAllForwardings=yes -o LogLevel=ERROR \
        -p "$1" -l "$2" -- "$3" "$5"
      echo "clusterctl-hop $i $?" >&2
      exec cat > /dev/null; }; } < /dev/null &
  outs="$outs $d/out$i"
  shift 5
done
[ "$fed" = 1 ] && exec < "$d/in"
# the head sends no byte before every node of the round says this (its hop is up): a hop
# that connects while bytes already flow leaves a backlog no link at rate B can catch up
echo "clusterctl-ready" >&2
receive() {
  if [ "$TRACE" = 1 ]; then
    dd bs=1 count=1 status=none && echo "clusterctl-mark first-byte" >&2
    dd bs=1M status=progress 2> "$d/progress"
    echo "clusterctl-mark last-byte" >&2
  else
    dd bs=1M status=progress 2> "$d/progress"
  fi
}
if [ "$z" = 1 ]; then
  # shellcheck disable=SC2086 # $outs: the children's fifos (paths under $d, no blanks), one word each on purpose
  receive | tee -p $outs | zstd -dcq | "$RT" load
else
  # shellcheck disable=SC2086 # $outs: the children's fifos (paths under $d, no blanks), one word each on purpose
  receive | tee -p $outs | "$RT" load
fi
rc=$?
[ "$TRACE" = 1 ] && echo "clusterctl-mark load-end" >&2
if [ "$rc" = 0 ]; then
  if [ -n "$ref" ]; then
    "$RT" tag "$id" "$ref" > /dev/null
  else
    "$RT" image inspect --format . "$id" > /dev/null
  fi
  echo "clusterctl-confirm $?" >&2
fi
tr '\r' '\n' < "$d/progress" | grep bytes | tail -n 1 >&2
kill "$hb" 2>/dev/null
wait
exit $rc
