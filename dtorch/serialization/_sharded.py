"""Hugging Face's sharded checkpoint folder (the ``save_pretrained``
layout), with ``huggingface_hub``'s function names:

    model-00001-of-00003.safetensors ... model-00003-of-00003.safetensors
    model.safetensors.index.json   {"metadata": {"total_size": N},
                                    "weight_map": {name: shard file}}

One shard is written as ``model.safetensors`` with no index, as the hub
does. Shards are plain safetensors files (metadata ``{"format": "pt"}``,
plus dtorch's checksums, which other readers ignore); with
``safe_serialization=False`` they are PyTorch zip files
(``pytorch_model-0000i-of-0000n.bin`` + ``pytorch_model.bin.index.json``).
"""
import json
import os
import re

from . import _safetensors as S
from ._files import write_to
from ._api import load, save
from ._errors import SerializationError

__all__ = ["save_torch_state_dict", "load_torch_model"]

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _size(s):
    """``5_000_000``, ``"5GB"`` (10**9) or ``"5GiB"`` (2**30) in bytes."""
    if isinstance(s, int) and s > 0:
        return s
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]+)\s*", str(s))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"max_shard_size must be a positive int of bytes "
                         f"or a size like '5GB' / '500MiB', not {s!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _split(arrays, limit):
    """Lists of names, in order, each list at most ``limit`` bytes (a
    larger tensor alone), as the hub splits."""
    shards, cur, size = [], [], 0
    for name, a in arrays.items():
        if cur and size + a.nbytes > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(name)
        size += a.nbytes
    if cur or not shards:
        shards.append(cur)
    return shards


def save_torch_state_dict(state_dict, save_directory, *,
                          filename_pattern=None, max_shard_size="5GB",
                          metadata=None, safe_serialization=True):
    """Write ``state_dict`` ({name: tensor}) into ``save_directory`` as
    shards of at most ``max_shard_size`` bytes plus the index. Each file
    is written atomically, the index last; shards of an earlier save
    under the same pattern that the new index does not name are removed
    after it.

    Example::

        dtorch.serialization.save_torch_state_dict(
            model.state_dict(), "out/", max_shard_size="2GB")
    """
    if filename_pattern is None:
        filename_pattern = ("model{suffix}.safetensors" if safe_serialization
                            else "pytorch_model{suffix}.bin")
    arrays = {}
    for k, t in state_dict.items():
        if not isinstance(k, str) or not hasattr(t, "_data"):
            raise SerializationError(
                f"save_torch_state_dict: entry {k!r} is a "
                f"{type(t).__name__}; a state dict maps str to tensors")
        arrays[k] = _plain(t, k)
    shards = _split(arrays, _size(max_shard_size))
    n = len(shards)
    files = [filename_pattern.format(
        suffix="" if n == 1 else f"-{i + 1:05d}-of-{n:05d}")
        for i in range(n)]
    os.makedirs(save_directory, exist_ok=True)
    for names, fname in zip(shards, files):
        path = os.path.join(save_directory, fname)
        if safe_serialization:
            part = {k: arrays[k] for k in names}
            write_to(path, lambda fh, seekable, part=part: S._write(
                fh, part, {"format": "pt"}, seekable))
        else:
            save({k: state_dict[k] for k in names}, path, format="torch")
    index = os.path.join(save_directory,
                         filename_pattern.format(suffix="") + ".index.json")
    keep = set(files)
    if n > 1:
        body = {"metadata": dict(metadata or {}, total_size=sum(
            a.nbytes for a in arrays.values())),
            "weight_map": {k: f for names, f in zip(shards, files)
                           for k in names}}
        text = json.dumps(body, indent=2, sort_keys=True).encode() + b"\n"
        write_to(index, lambda fh, seekable: fh.write(text))
        keep.add(os.path.basename(index))
    _remove_stale(save_directory, filename_pattern, keep)


def _plain(t, name):
    """A C-contiguous little-endian NumPy copy/view of a tensor."""
    a = t._data
    if hasattr(a, "get"):                 # CuPy
        a = a.get()
    if not (a.flags.c_contiguous and a.dtype in S._LITTLE):
        a = S._Encoder._convert(a, repr(name))
    return a


def _remove_stale(folder, pattern, keep):
    stem, _, ext = pattern.partition("{suffix}")
    shard = re.compile(re.escape(stem) + r"(-\d{5}-of-\d{5})?"
                       + re.escape(ext) + r"(\.index\.json)?")
    for f in os.listdir(folder):
        if shard.fullmatch(f) and f not in keep:
            os.unlink(os.path.join(folder, f))


def read_folder(folder, map_location=None, mmap=True, weights_only=True,
                safe=True):
    """{name: tensor} of a sharded folder (or of its single file); with
    ``safe`` the safetensors files are looked for first, else the .bin
    ones."""
    names = ["model.safetensors", "pytorch_model.bin"]
    if not safe:
        names.reverse()
    index = _find_index(folder, names)
    if index is None:
        for single in names:
            path = os.path.join(folder, single)
            if os.path.exists(path):
                return load(path, map_location, mmap=mmap,
                            weights_only=weights_only)
        raise FileNotFoundError(
            f"{folder} holds no model.safetensors(.index.json) or "
            "pytorch_model.bin(.index.json)")
    try:
        with open(index, "rb") as fh:
            body = json.load(fh)
        weight_map = body["weight_map"]
        assert isinstance(weight_map, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise SerializationError(f"{index}: not a shard index (needs a "
                                 "JSON object with a weight_map)") from None
    out = {}
    for shard in sorted(set(weight_map.values())):
        if (not isinstance(shard, str) or os.path.basename(shard) != shard
                or shard in ("", ".", "..")):
            raise SerializationError(
                f"{index}: shard {shard!r} is not a file name in the folder"
                " (a path outside the checkpoint is refused)")
        part = load(os.path.join(folder, shard), map_location, mmap=mmap,
                    weights_only=weights_only)
        want = {k for k, f in weight_map.items() if f == shard}
        if not isinstance(part, dict) or not want <= set(part):
            missing = sorted(want - set(part if isinstance(part, dict)
                                        else ()))
            raise SerializationError(
                f"{os.path.join(folder, shard)} lacks tensors the index puts"
                f" there: {missing[:5]}")
        out.update((k, part[k]) for k in want)
    return out


def _find_index(folder, names):
    for name in names:
        path = os.path.join(folder, name + ".index.json")
        if os.path.exists(path):
            return path
    return None


def load_torch_model(model, checkpoint_path, *, strict=False, safe=True,
                     weights_only=True, map_location=None, mmap=True):
    """Load a checkpoint folder (sharded or single file; ``safe``: prefer
    its safetensors files to its .bin ones) or a file into ``model``;
    returns ``(missing_keys, unexpected_keys)`` as
    ``load_state_dict`` reports them (``strict=True`` raises on either,
    with its message). Shards are mapped (``mmap``), not read whole.

    Example::

        dtorch.serialization.load_torch_model(model, "out/", strict=True)
    """
    if os.path.isdir(checkpoint_path):
        sd = read_folder(checkpoint_path, map_location, mmap, weights_only,
                         safe)
    else:
        sd = load(checkpoint_path, map_location, mmap=mmap,
                  weights_only=weights_only)
    return model.load_state_dict(sd, strict=strict)
