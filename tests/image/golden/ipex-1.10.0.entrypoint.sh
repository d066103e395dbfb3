#!/bin/bash
# Entrypoint of the clusterctl "ipex" image, rendered by clusterctl.
# Sets up the environment that a RUN step cannot persist, then runs the command.
fail() { echo "clusterctl entrypoint (ipex): environment step $1 failed" >&2; exit 1; }
ccl_dir="$(python3 -c 'import os, torch_ccl as m; print(os.path.dirname(os.path.abspath(m.__file__)))')" || fail 1
. "$ccl_dir/env/setvars.sh" || fail 2
exec "$@"
