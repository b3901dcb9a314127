"""``save`` and ``load``: which format a call reads or writes (the
formats themselves live in ``_safetensors``, ``_torch_format`` (reading
PyTorch's files) and ``_torch_write``; the file plumbing in ``_files``)."""
import os
import warnings
from typing import IO, Any, Callable, Union

from .. import _backend as B
from . import _files, _safetensors, _torch_format, _torch_write
from ._errors import NotPlainError, SerializationError

# the argument types of save/load, as PyTorch spells them
FileLike = Union[str, os.PathLike, IO[bytes]]
MapLocation = Union[str, B.device, dict[str, str], Callable[..., Any], None]
DEFAULT_PROTOCOL = 2


def save(obj: Any, f: FileLike, pickle_module: Any = None,
         pickle_protocol: int = DEFAULT_PROTOCOL,
         _use_new_zipfile_serialization: bool = True,
         _disable_byteorder_record: bool = False, *,
         format: str | None = None) -> None:
    """Save ``obj`` to ``f`` (a path, written atomically, or a binary
    file object).

    ``format``: None picks dtorch's safetensors file for tensors in
    nested dicts/lists/tuples with plain Python values, and PyTorch's zip
    format for anything else (a whole ``nn.Module``, a user class:
    pickled, as ``torch.save`` does); ``"torch"`` always writes PyTorch's
    zip format (``torch.load(f, weights_only=True)`` reads it);
    ``"safetensors"`` refuses what that layout cannot hold.
    ``pickle_module`` / ``pickle_protocol`` apply to the zip format; it is
    written even where ``_use_new_zipfile_serialization=False`` asks for
    the legacy one (dtorch reads legacy files, it does not write them).

    Example::

        dtorch.save({"model": model.state_dict(),
                     "optim": opt.state_dict(), "epoch": 3}, "ckpt.pt")
        dtorch.save(model.state_dict(), "for_torch.pt", format="torch")
    """
    if format not in (None, "safetensors", "torch"):
        raise ValueError(f"dtorch.save: format must be None, 'safetensors' "
                         f"or 'torch', not {format!r}")
    write = plain = None
    if format != "torch":
        try:
            write = _safetensors.encode(obj)
        except NotPlainError as e:
            if format == "safetensors":
                raise
            plain = e
    if write is None:
        try:
            write = _torch_write.writer(obj, pickle_module, pickle_protocol)
        except SerializationError as e:
            if plain is None:
                raise
            raise SerializationError(
                f"dtorch.save cannot store the object: {plain}; and "
                f"pickling it (PyTorch's format) fails: {e}") from e
    _files.write_to(f, write)


def load(f: FileLike, map_location: MapLocation = None,
         pickle_module: Any = None, *, weights_only: bool | None = None,
         mmap: bool | None = None, **pickle_load_args: Any) -> Any:
    """Load a file written by ``dtorch.save``, ``torch.save`` (zip or
    legacy format) or any safetensors writer (as a dict of tensors).

    ``weights_only`` (default True, as PyTorch 2.6+; False by default
    only when a ``pickle_module`` is given): PyTorch's files are read by
    an unpickler that rebuilds tensors, parameters, containers, numbers,
    strings, dtypes, devices and sizes, plus the globals allowed with
    ``dtorch.serialization.add_safe_globals`` / ``safe_globals``, and
    refuses anything else without calling it. ``weights_only=False`` runs
    the file's pickle as ``pickle`` does (only for files you trust);
    ``torch.X`` globals in it mean ``dtorch.X``. dtorch and safetensors
    files hold no code whatever the flag.

    ``map_location``: None (each tensor's saved device), ``'cpu'``,
    ``'cuda[:i]'``, a ``dtorch.device``, a ``{saved: target}`` dict, or a
    callable ``f(tensor, saved_location)``. ``mmap=True`` (a path only)
    maps the file copy-on-write instead of reading it: tensors are views
    of the mapping, and writes to them never reach the file.

    Example::

        ckpt = dtorch.load("ckpt.pt", map_location="cpu")
        model.load_state_dict(ckpt["model"])
    """
    if weights_only is None:
        weights_only = pickle_module is None
    if weights_only and pickle_module is not None:
        raise RuntimeError("Can not safely load weights when explicit "
                           "pickle_module is specified")
    if pickle_load_args and weights_only:
        warnings.warn("pickle_load_args only works if `weights_only=False`.")
    pickle_load_args.setdefault("encoding", "utf-8")
    with _files.open_file(f, bool(mmap)) as src:
        if src.head.startswith(b"PK\x03\x04"):
            return _torch_format.load_zip(src, map_location, weights_only,
                                          pickle_module, pickle_load_args)
        if _torch_format.is_legacy(src.head):
            return _torch_format.load_legacy(src, map_location, weights_only,
                                             pickle_module, pickle_load_args)
        return _safetensors.load_opened(src, map_location)
