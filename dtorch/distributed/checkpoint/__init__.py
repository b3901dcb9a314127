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
from ._core import (CheckpointException, CheckpointManager,  # noqa: F401
                    async_save, latest_checkpoint, load, save, shard_of)
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


class FileSystemWriter:
    """PyTorch's storage writer naming a directory: ``save(sd,
    storage_writer=FileSystemWriter(path))`` is ``checkpoint_id=path``.
    ``sync_files=False`` skips the fsyncs: faster, but a power loss (not
    a crash of the process) may then lose a checkpoint that was
    reported saved. ``cache_staged_state_dict=True``: async_save copies
    into the host buffers of the previous async save (kept between saves:
    one more copy of the state in memory) instead of fresh memory, whose
    first touch costs more than the copy."""

    def __init__(self, path, single_file_per_rank=True, sync_files=True,
                 *args, cache_staged_state_dict=False, **kwargs):
        self.path = path
        self.sync_files = sync_files
        self.cache_staged_state_dict = cache_staged_state_dict


class FileSystemReader:
    """PyTorch's storage reader naming a directory (see FileSystemWriter);
    ``read_metadata()`` returns the checkpoint's Metadata."""

    def __init__(self, path):
        self.path = path

    def read_metadata(self):
        from ._core import _read_metadata
        return _read_metadata(latest_checkpoint(self.path) or self.path)
