"""``dtorch.save`` / ``dtorch.load`` (PyTorch's API) over three formats:

- dtorch's own (the default of ``save`` for tensors and containers of
  them): one safetensors file with checksums, never pickle
  (``_safetensors``);
- PyTorch's zip and legacy pickle files (``_torch_format``): ``load``
  reads them with ``weights_only=True`` by default, as torch 2.6+ does,
  through an interpreter that calls nothing outside PyTorch's allow-list
  and the user's ``add_safe_globals`` (``_weights_only``); ``save`` writes
  the zip format for whole objects (a Module) or when asked
  (``format="torch"``);
- Hugging Face's sharded safetensors folders (``_sharded``).

dtorch runs code from a file only when the caller passes
``weights_only=False``.
"""
from ._errors import ChecksumError, SerializationError, WeightsOnlyError, \
    json_document
from ._api import DEFAULT_PROTOCOL, FileLike, MapLocation, load, save  # noqa
from ._sharded import load_torch_model, save_torch_state_dict
from ._weights_only import (add_safe_globals, clear_safe_globals,
                            get_safe_globals, safe_globals)
# the safetensors layout's internals, read by dtorch.distributed.checkpoint
# and the benchmarks under these names
from ._safetensors import (_CODES, _DTYPES, _HEADER_CRC_KEY, _LITTLE,  # noqa
                           _MAX_HEADER, _Checksums, _Decoder, _Encoder,
                           _bytes_of, _write)
from ._files import _fsync_dir, _pid_alive  # noqa: F401

__all__ = ["save", "load", "SerializationError", "ChecksumError",
           "WeightsOnlyError", "add_safe_globals", "get_safe_globals",
           "clear_safe_globals", "safe_globals", "save_torch_state_dict",
           "load_torch_model"]

