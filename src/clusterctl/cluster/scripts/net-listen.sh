#!/bin/sh
# The listeners of check --network (cluster/netcheck.py), run as `sh -c TEXT sh MARKER LIFE [PORT]`:
# a TCP listener on a port the kernel picks (as gloo and NCCL pick theirs) and, when PORT is
# given, one on PORT (the rendezvous: MASTER_PORT on the master).  Prints one line,
# "MARKER ports COLLECTIVE RENDEZVOUS PID" (RENDEZVOUS "busy": something else holds it and
# answers for it; "-": none asked), then goes on in the background, accepting and closing
# connections, until LIFE seconds have passed or it is killed.  Writes nothing.
# Exit 127 when the node has no python3.
command -v python3 >/dev/null 2>&1 || { echo "no python3 on the node"; exit 127; }
exec python3 -c '
import os
import select
import socket
import sys
import time

marker, life = sys.argv[1], float(sys.argv[2])
wanted = int(sys.argv[3]) if len(sys.argv) > 3 else None


def listen(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as torch.distributed'"'"'s store does: a run that just ended leaves its connections to
    # MASTER_PORT in TIME_WAIT, which would make the port look "busy" (then refused)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(128)
    return s


socks = [listen(0)]
rendezvous = "-"
if wanted is not None:
    try:
        socks.append(listen(wanted))
        rendezvous = str(wanted)
    except OSError:
        rendezvous = "busy"
pid = os.fork()
if pid:
    print(f"{marker} ports {socks[0].getsockname()[1]} {rendezvous} {pid}", flush=True)
    os._exit(0)
os.setsid()
devnull = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(devnull, fd)
end = time.monotonic() + life
while time.monotonic() < end:
    ready, _, _ = select.select(socks, [], [], max(0.0, min(1.0, end - time.monotonic())))
    for s in ready:
        try:
            conn, _ = s.accept()
            conn.close()
        except OSError:
            pass
' "$@"
