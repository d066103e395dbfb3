#!/bin/sh
# The connections of check --network (cluster/netcheck.py), run as
# `sh -c TEXT sh MARKER TIMEOUT ADDRESS:PORT...`: a TCP connect to each target at once
# (32 at a time), each bounded by TIMEOUT seconds; prints "MARKER I ok" or
# "MARKER I blocked WHY" per target I (0-based, in the order given): WHY is timeout,
# refused, unreachable or the error's name.  Sends nothing, writes nothing.
# Exit 127 when the node has no python3.
command -v python3 >/dev/null 2>&1 || { echo "no python3 on the node"; exit 127; }
exec python3 -c '
import errno
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

marker, timeout, targets = sys.argv[1], float(sys.argv[2]), sys.argv[3:]


def probe(item):
    index, target = item
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return index, "ok"
    except socket.timeout:  # noqa: UP041 (a node may run Python < 3.10, where it is no TimeoutError)
        return index, "blocked timeout"
    except ConnectionRefusedError:
        return index, "blocked refused"
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return index, "blocked unreachable"
        return index, "blocked " + (errno.errorcode.get(e.errno or 0) or type(e).__name__)


with ThreadPoolExecutor(max_workers=32) as pool:
    for index, outcome in pool.map(probe, enumerate(targets)):
        print(f"{marker} {index} {outcome}", flush=True)
' "$@"
