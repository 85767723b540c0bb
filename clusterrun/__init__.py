"""clusterrun: PyTorch distributed training across a few machines over SSH, from one command."""

__version__ = "0.1.0"
