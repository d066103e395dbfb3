# Dockerfile of the clusterctl "cambricon" image.
# Rendered by `clusterctl render --target cambricon` from templates/cambricon/;
# edit the template or src/clusterctl/image/data/*.yaml, not this file.
#
# Cambricon PyTorch (torch_mlu) with CNCL; backend cncl. The base image comes
# from Cambricon as a tarball (`docker load`); older ones keep torch in a venv,
# which the entrypoint activates.
FROM pytorch:v1.17.0-torch1.13.1-ubuntu20.04-py310

LABEL org.opencontainers.image.title="clusterctl cambricon" \
      io.clusterctl.target="cambricon" \
      io.clusterctl.torch="1.13.1"

# clusterctl's tools (src/clusterctl/image/data/targets.yaml, tools:): py-spy dumps the
# ranks' Python stacks when `clusterctl launch --hang-timeout` finds a run hung.
RUN python -m pip install --no-cache-dir \
        py-spy==0.4.3

# The repository's example training scripts (examples/), for `clusterctl launch`.
COPY examples/ /opt/clusterctl/examples/

# The entrypoint script sets up what a RUN step cannot persist (sourced
# environments), then execs the command; it is executable in the build context.
COPY entrypoint.sh /opt/clusterctl/entrypoint.sh
ENTRYPOINT ["/opt/clusterctl/entrypoint.sh"]
CMD ["bash"]
