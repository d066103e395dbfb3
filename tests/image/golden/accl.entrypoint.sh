#!/bin/bash
# Entrypoint of the clusterctl "accl" image, rendered by clusterctl.
# Sets up the environment that a RUN step cannot persist, then runs the command.
exec "$@"
