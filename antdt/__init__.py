"""AntDT: a straggler-mitigation control plane for data-parallel PyTorch training."""

__version__ = "0.1.0"
