"""clusterctl: build accelerator-stack PyTorch images and run them on your own nodes.

The package is a library first; ``clusterctl.cli`` is a thin typer layer over it.
"""

__version__ = "0.1.0"
