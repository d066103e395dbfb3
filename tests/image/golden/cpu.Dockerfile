# Dockerfile of the clusterctl "cpu" image.
# Rendered by `clusterctl render --target cpu --torch 2.13.0` from templates/cpu/;
# edit the template or src/clusterctl/image/data/*.yaml, not this file.
#
# CPU-only PyTorch 2.13.0 with gloo, on the Debian base that
# `clusterctl build --target base` debootstraps locally (no registry here).
# torch is installed offline from the host's wheelhouse with pip run from its
# own wheel: bookworm's python3 has no pip, and builds must not download.
# Stage "wheels": pip installs the wheelhouse under /opt/clusterctl-site in a throw-away
# stage, and the image copies only what was installed: the wheels (gigabytes for torch)
# never become a layer of the image (a COPY layer stays even after `rm -rf`).
FROM clusterctl/base:bookworm AS wheels
COPY wheels/ /tmp/wheels/
RUN set -- /tmp/wheels/pip-*.whl \
 && python3 "$1/pip" install --no-cache-dir --no-index --find-links /tmp/wheels --root /opt/clusterctl-site --break-system-packages \
        torch==2.13.0 numpy==2.4.6 py-spy==0.4.3

FROM clusterctl/base:bookworm

LABEL org.opencontainers.image.title="clusterctl cpu" \
      io.clusterctl.target="cpu" \
      io.clusterctl.torch="2.13.0"

# Defaults of the stack's environment (`clusterctl launch` may override them).
ENV OMP_NUM_THREADS="1"

# What pip installed in stage "wheels" (offline, from the build context's wheels/).
COPY --from=wheels /opt/clusterctl-site/ /

# The repository's example training scripts (examples/), for `clusterctl launch`.
COPY examples/ /opt/clusterctl/examples/

# The entrypoint script sets up what a RUN step cannot persist (sourced
# environments), then execs the command; it is executable in the build context.
COPY entrypoint.sh /opt/clusterctl/entrypoint.sh
ENTRYPOINT ["/opt/clusterctl/entrypoint.sh"]
CMD ["bash"]
