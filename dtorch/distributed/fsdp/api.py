"""Mixed precision configurations for FSDP (PyTorch's names and defaults):
``MixedPrecision`` for ``FullyShardedDataParallel`` and
``MixedPrecisionPolicy`` for ``fully_shard``."""
from dataclasses import dataclass
from typing import Optional

__all__ = ["MixedPrecision", "MixedPrecisionPolicy"]


@dataclass(frozen=True)
class MixedPrecision:
    """The shards stay in full precision (the optimizer's master weights);
    a unit's gathered parameters are cast to ``param_dtype`` for forward
    and backward; gradients are reduce-scattered in ``reduce_dtype``
    (default: ``param_dtype``) and land on the shard in its dtype unless
    ``keep_low_precision_grads``; floating buffers are kept in
    ``buffer_dtype`` (saved in their original dtype by ``state_dict``);
    floating-point inputs are cast to ``param_dtype`` by the root
    (``cast_root_forward_inputs``) and by every unit
    (``cast_forward_inputs``)."""
    param_dtype: Optional[object] = None
    reduce_dtype: Optional[object] = None
    buffer_dtype: Optional[object] = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """``fully_shard``'s (FSDP2) policy: ``param_dtype`` and
    ``reduce_dtype`` as ``MixedPrecision``; ``output_dtype`` casts the
    module's floating-point outputs; ``cast_forward_inputs`` casts its
    floating-point inputs to ``param_dtype``. Gradients always land on the
    shards in full precision."""
    param_dtype: Optional[object] = None
    reduce_dtype: Optional[object] = None
    output_dtype: Optional[object] = None
    cast_forward_inputs: bool = True
