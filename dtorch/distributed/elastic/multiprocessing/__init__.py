"""``torch.distributed.elastic.multiprocessing`` for scripts: only its
``errors`` module (``record``, ``ChildFailedError``) is here; dtorch-launch
starts and watches the ranks itself (``start_processes`` is not built)."""
from . import errors

__all__ = ["errors"]
