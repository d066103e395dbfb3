#!/bin/sh
# exec-bounded.sh SECONDS CAP ARGV...: `clusterctl exec`'s command on one node.  ARGV runs
# with no stdin and its stderr on its stdout; at most CAP bytes of that go on (the rest is
# read and dropped, so the command neither blocks nor dies of a closed pipe); where the node
# has timeout(1), ARGV is ended after SECONDS (exit 124, as timeout says); the script exits
# with ARGV's status.
t=$1 cap=$2
shift 2
if command -v timeout > /dev/null 2>&1; then set -- timeout -k 5 "$t" "$@"; fi
exec 3>&1
rc=$( { { "$@" < /dev/null 2>&1 3>&- 4>&-; echo $? >&4; } | { head -c "$cap"; cat > /dev/null; } >&3 3>&- 4>&-; } 4>&1 )
exit "${rc:-125}"
