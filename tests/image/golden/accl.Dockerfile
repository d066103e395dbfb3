# Dockerfile of the clusterctl "accl" image.
# Rendered by `clusterctl render --target accl` from templates/accl/;
# edit the template or src/clusterctl/image/data/*.yaml, not this file.
#
# NVIDIA NGC PyTorch + Alibaba ACCL runtime + torch_accl, backend accl (seeds/003).
# distributed_c10d.py is patched so accl is treated like nccl; the patch script
# fails the build, naming the edit and the torch version, when an anchor is
# missing (sed would have succeeded silently and left a broken image).
FROM nvcr.io/nvidia/pytorch:21.09-py3

LABEL org.opencontainers.image.title="clusterctl accl" \
      io.clusterctl.target="accl" \
      io.clusterctl.torch="1.10.0a0"

ARG ACCL_INSTALLER_URL="http://eflops.oss-cn-beijing.aliyuncs.com/accl/ubuntu20.04/accl-v1.3.2-4-ubuntu20.04-cuda11.4.sh"
ARG TORCH_ACCL_WHEEL_URL="http://eflops.oss-cn-beijing.aliyuncs.com/accl/torch/ngc/21.09/torch_accl-0.3.0-cp38-cp38-linux_x86_64.whl"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Defaults of the stack's environment (`clusterctl launch` may override them).
ENV ACCL_LOG_LEVEL="INFO"

# ACCL runtime: a shell installer (not a Python package, so never from the wheelhouse).
RUN curl -fsSL --retry 3 -o /tmp/accl.sh "$ACCL_INSTALLER_URL" \
 && bash /tmp/accl.sh \
 && rm -f /tmp/accl.sh

# torch_accl from its wheel URL; the file keeps its name (pip reads the wheel tags from it).
# DL3013 (pin versions): the wheel file is the pin, its version is in its name.
# hadolint ignore=DL3013
RUN wheel="/tmp/$(basename "$TORCH_ACCL_WHEEL_URL")" \
 && curl -fsSL --retry 3 -o "$wheel" "$TORCH_ACCL_WHEEL_URL" \
 && python -m pip install --no-cache-dir "$wheel" \
 && rm -f "$wheel"

# clusterctl's tools (src/clusterctl/image/data/targets.yaml, tools:): py-spy dumps the
# ranks' Python stacks when `clusterctl launch --hang-timeout` finds a run hung.
RUN python -m pip install --no-cache-dir \
        py-spy==0.4.3

# Locate distributed_c10d.py through torch itself (the path differs per base image).
COPY accl/patch_c10d.py /opt/clusterctl/accl/patch_c10d.py
RUN c10d="$(python -c 'import torch.distributed.distributed_c10d as m; print(m.__file__)')" \
 && version="$(python -c 'import torch; print(torch.__version__)')" \
 && python /opt/clusterctl/accl/patch_c10d.py --file "$c10d" --torch-version "$version"

# The repository's example training scripts (examples/), for `clusterctl launch`.
COPY examples/ /opt/clusterctl/examples/

# The entrypoint script sets up what a RUN step cannot persist (sourced
# environments), then execs the command; it is executable in the build context.
COPY entrypoint.sh /opt/clusterctl/entrypoint.sh
ENTRYPOINT ["/opt/clusterctl/entrypoint.sh"]
CMD ["bash"]
