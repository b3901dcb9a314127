"""``dtorch.distributed.tensor``: where PyTorch keeps DTensor and its
experimental features. dtorch has no DTensor; ``experimental`` holds
context parallelism (``context_parallel``), which needs none."""
