# Dockerfile of the clusterctl "ipex" image.
# Rendered by `clusterctl render --target ipex --torch 2.3.1` from templates/ipex/;
# edit the template or src/clusterctl/image/data/*.yaml, not this file.
#
# Intel CPU: torch 2.3.1 + Intel Extension for PyTorch 2.3.100
# + oneCCL bindings 2.3.100 (oneccl_bindings_for_pytorch), backend ccl.
# The three versions must match exactly (src/clusterctl/image/data/ipex_versions.yaml).
# setvars.sh (the oneCCL/MPI environment) is sourced by the entrypoint.
FROM python:3.10-slim-bookworm

LABEL org.opencontainers.image.title="clusterctl ipex" \
      io.clusterctl.target="ipex" \
      io.clusterctl.torch="2.3.1"

# Defaults of the stack's environment (`clusterctl launch` may override them).
ENV CCL_ATL_TRANSPORT="ofi" \
    CCL_WORKER_COUNT="1"

# From the package indexes of src/clusterctl/image/data (with --wheelhouse DIR: offline instead).
RUN python3 -m pip install --no-cache-dir \
        --extra-index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pytorch-extension.intel.com/release-whl/stable/cpu/us/ \
        torch==2.3.1 intel_extension_for_pytorch==2.3.100 oneccl_bind_pt==2.3.100 py-spy==0.4.3

# The repository's example training scripts (examples/), for `clusterctl launch`.
COPY examples/ /opt/clusterctl/examples/

# The entrypoint script sets up what a RUN step cannot persist (sourced
# environments), then execs the command; it is executable in the build context.
COPY entrypoint.sh /opt/clusterctl/entrypoint.sh
ENTRYPOINT ["/opt/clusterctl/entrypoint.sh"]
CMD ["bash"]
