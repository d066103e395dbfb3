#!/bin/bash
# Entrypoint of the clusterctl "cambricon" image, rendered by clusterctl.
# Sets up the environment that a RUN step cannot persist, then runs the command.
fail() { echo "clusterctl entrypoint (cambricon): environment step $1 failed" >&2; exit 1; }
if [ -f /torch/venv3/pytorch/bin/activate ]; then . /torch/venv3/pytorch/bin/activate; fi || fail 1
exec "$@"
