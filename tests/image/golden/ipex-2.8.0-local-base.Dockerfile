# Dockerfile of the clusterctl "ipex" image.
# Rendered by `clusterctl render --target ipex --torch 2.8.0 --base-image clusterctl/base:bookworm` from templates/ipex/;
# edit the template or src/clusterctl/image/data/*.yaml, not this file.
#
# Intel CPU: torch 2.8.0 + Intel Extension for PyTorch 2.8.0
# + oneCCL bindings 2.8.0 (oneccl_bindings_for_pytorch), backend ccl.
# The three versions must match exactly (src/clusterctl/image/data/ipex_versions.yaml).
# setvars.sh (the oneCCL/MPI environment) is sourced by the entrypoint.
# Stage "wheels": pip installs the wheelhouse under /opt/clusterctl-site in a throw-away
# stage, and the image copies only what was installed: the wheels (gigabytes for torch)
# never become a layer of the image (a COPY layer stays even after `rm -rf`).
FROM clusterctl/base:bookworm AS wheels
COPY wheels/ /tmp/wheels/
RUN set -- /tmp/wheels/pip-*.whl \
 && python3 "$1/pip" install --no-cache-dir --no-index --find-links /tmp/wheels --root /opt/clusterctl-site --break-system-packages \
        torch==2.8.0 intel_extension_for_pytorch==2.8.0 oneccl_bind_pt==2.8.0 py-spy==0.4.3

FROM clusterctl/base:bookworm

LABEL org.opencontainers.image.title="clusterctl ipex" \
      io.clusterctl.target="ipex" \
      io.clusterctl.torch="2.8.0"

# Defaults of the stack's environment (`clusterctl launch` may override them).
ENV CCL_ATL_TRANSPORT="ofi" \
    CCL_WORKER_COUNT="1"

# What pip installed in stage "wheels" (offline, from the build context's wheels/).
COPY --from=wheels /opt/clusterctl-site/ /

# The repository's example training scripts (examples/), for `clusterctl launch`.
COPY examples/ /opt/clusterctl/examples/

# The entrypoint script sets up what a RUN step cannot persist (sourced
# environments), then execs the command; it is executable in the build context.
COPY entrypoint.sh /opt/clusterctl/entrypoint.sh
ENTRYPOINT ["/opt/clusterctl/entrypoint.sh"]
CMD ["bash"]
