"""``dtorch.distributed.checkpoint`` (dcp): sharded, atomic, asynchronous
checkpoints that load on any world size and tensor-parallel layout, with
PyTorch's names.

A checkpoint is a directory: one safetensors file per rank that owns
something (``__<rank>_0.safetensors``, tensor names = the state_dict's
dotted keys) and one ``.metadata`` (JSON: each tensor's global shape,
dtype and chunks with their files, world size, layout, step, a checksum
per file). Example (every rank runs it)::

    import dtorch.distributed.checkpoint as dcp
    from dtorch.distributed.checkpoint.state_dict import (
        get_state_dict, set_state_dict)

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "sched": scheduler,
             "sampler": sampler, "rng": dcp.RNGState(), "step": step}
    dcp.save(state, checkpoint_id="ckpt/step_100")     # or:
    fut = dcp.async_save(state, checkpoint_id="ckpt/step_100")
    ...
    dcp.load(state, checkpoint_id="ckpt/step_100")     # in place
    set_state_dict(model, optimizer, model_state_dict=model_sd,
                   optim_state_dict=optim_sd)

Objects with ``state_dict()``/``load_state_dict()`` (Stateful: schedulers,
samplers, GradScaler, RNGState, modules) are saved through their state
dicts and get ``load_state_dict`` after a load. Values that differ between
ranks (RNG states, per-rank tensors) are kept per rank; tensors equal on
every rank are written once. ``CheckpointManager`` keeps the last K
checkpoints of a folder with a ``latest`` pointer.
"""
from ._files import (FileSystemReader, FileSystemWriter,  # noqa: F401
                     latest_checkpoint)
from ._load import load  # noqa: F401
from ._manager import CheckpointManager  # noqa: F401
from ._save import async_save, save  # noqa: F401
from ._shards import CheckpointException, shard_of  # noqa: F401
from .metadata import (BytesStorageMetadata,  # noqa: F401
                       ChunkStorageMetadata, Metadata,
                       TensorStorageMetadata)
from .stateful import RNGState, Stateful  # noqa: F401
from . import format_utils, state_dict  # noqa: F401

__all__ = ["save", "load", "async_save", "CheckpointException",
           "CheckpointManager", "latest_checkpoint", "shard_of",
           "Metadata", "TensorStorageMetadata", "ChunkStorageMetadata",
           "BytesStorageMetadata", "Stateful", "RNGState",
           "FileSystemWriter", "FileSystemReader", "state_dict",
           "format_utils"]
