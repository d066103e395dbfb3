# Dockerfile of the clusterctl "nccl" image.
# Rendered by `clusterctl render --target nccl` from templates/nccl/;
# edit the template or src/clusterctl/image/data/*.yaml, not this file.
#
# NVIDIA NGC PyTorch, which ships torch with NCCL; backend nccl.
FROM nvcr.io/nvidia/pytorch:24.01-py3

LABEL org.opencontainers.image.title="clusterctl nccl" \
      io.clusterctl.target="nccl" \
      io.clusterctl.torch="2.2.0a0"

# Offline: every wheel comes from wheels/ in the build context, no index is asked.
COPY wheels/ /tmp/wheels/
RUN python -m pip install --no-cache-dir --no-index --find-links /tmp/wheels \
        /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels

# The repository's example training scripts (examples/), for `clusterctl launch`.
COPY examples/ /opt/clusterctl/examples/

# The entrypoint script sets up what a RUN step cannot persist (sourced
# environments), then execs the command; it is executable in the build context.
COPY entrypoint.sh /opt/clusterctl/entrypoint.sh
ENTRYPOINT ["/opt/clusterctl/entrypoint.sh"]
CMD ["bash"]
