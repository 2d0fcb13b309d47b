"""PyTorch integration: the DDP comm hook (``hook``), workloads, and the training loop.

Importing ``host.ddp`` does not import torch; import the submodules you need.
"""
