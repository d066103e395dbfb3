# Dockerfile of the clusterctl "cpu" image.
# Rendered by `clusterctl render --target cpu --torch 2.13.0` from templates/cpu/;
# edit the template or src/clusterctl/build/data/*.yaml, not this file.
#
# CPU-only PyTorch 2.13.0 with gloo, on the Debian base that
# `clusterctl build --target base` debootstraps locally (no registry here).
# torch is installed offline from the host's wheelhouse with pip run from its
# own wheel: bookworm's python3 has no pip, and builds must not download.
FROM clusterctl/base:bookworm

LABEL org.opencontainers.image.title="clusterctl cpu" \
      io.clusterctl.target="cpu" \
      io.clusterctl.torch="2.13.0"

# Defaults of the stack's environment (`clusterctl launch` may override them).
ENV OMP_NUM_THREADS="1"

# Offline: every wheel comes from wheels/ in the build context, no index is asked.
COPY wheels/ /tmp/wheels/
RUN set -- /tmp/wheels/pip-*.whl \
 && python3 "$1/pip" install --no-cache-dir --no-index --find-links /tmp/wheels --break-system-packages \
        torch==2.13.0 numpy==2.4.6 py-spy==0.4.3 \
 && rm -rf /tmp/wheels

# The repository's example training scripts (examples/), for `clusterctl launch`.
COPY examples/ /opt/clusterctl/examples/

# The entrypoint script sets up what a RUN step cannot persist (sourced
# environments), then execs the command; it is executable in the build context.
COPY entrypoint.sh /opt/clusterctl/entrypoint.sh
ENTRYPOINT ["/opt/clusterctl/entrypoint.sh"]
CMD ["bash"]
