"""``dtorch.distributed.fsdp``: fully sharded data parallelism (ZeRO stage
3), PyTorch's module path: ``FullyShardedDataParallel`` (and its short
name ``FSDP``), ``fully_shard`` and the wrap policies."""
from .fully_sharded_data_parallel import (FSDPModule,
                                          FullyShardedDataParallel,
                                          StateDictType,
                                          fully_shard)
from .api import MixedPrecision, MixedPrecisionPolicy
from .wrap import (ModuleWrapPolicy, always_wrap_policy,
                   size_based_auto_wrap_policy)

FSDP = FullyShardedDataParallel

__all__ = ["FullyShardedDataParallel", "FSDP", "StateDictType",
           "ModuleWrapPolicy", "size_based_auto_wrap_policy",
           "always_wrap_policy", "fully_shard", "FSDPModule",
           "MixedPrecision", "MixedPrecisionPolicy"]
