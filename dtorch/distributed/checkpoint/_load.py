"""dcp.load: read ``.metadata``, find for each tensor of the given
state_dict the saved chunks that overlap this rank's box (any world size
or sharding), read and verify those files, assemble every tensor in
temporaries, agree across ranks that all of it succeeded, and only then
copy into the state_dict (nothing half-loaded)."""
import math
import os
import warnings

import numpy as np

from ... import _backend as B
from ... import serialization as S
from ...tensor import Tensor
from . import metadata as M
from ._files import _file_header_crc, _read_metadata, latest_checkpoint
from ._flatten import _decode_object, _Flat, _is_module
from ._groups import (_base_group, _ckpt_group, _gather, _raise_failures,
                      _rank, _wait_pending)
from ._shards import CheckpointException, _is_tensor, _overlap, _spec
from .state_dict import set_model_state_dict


class _Reader:
    """Shard files of one checkpoint, opened once each and verified
    (size and header CRC against the metadata, then every tensor's
    checksum); tensors come back as views of a copy-on-write mapping."""

    def __init__(self, path, meta):
        self.path, self.meta, self.files = path, meta, {}

    def get(self, fname, name, key):
        if fname not in self.files:
            self.files[fname] = self._open(fname, key)
        arrays = self.files[fname]
        where = os.path.join(self.path, fname)
        if name not in arrays:
            raise CheckpointException(
                f"{where}: holds no tensor {name!r} (tensor {key!r}); the "
                "shard file does not match the metadata")
        return arrays[name]

    def _open(self, fname, key):
        where = os.path.join(self.path, fname)
        info = self.meta.raw["files"].get(fname)
        if info is None:
            raise CheckpointException(
                f"{self.path}: the metadata lists no file {fname!r} (needed "
                f"for tensor {key!r})")
        # metadata.loads admits plain names only; a link may still point
        # out of the directory: read nothing outside it
        real = os.path.realpath(where)
        if not M.plain_name(fname) or os.path.commonpath(
                [real, os.path.realpath(self.path)]) != \
                os.path.realpath(self.path):
            raise CheckpointException(
                f"{where}: the shard file {fname!r} resolves to {real}, "
                f"outside the checkpoint directory {self.path}; refusing to "
                f"read it (needed for tensor {key!r})")
        try:
            size = os.path.getsize(where)
        except FileNotFoundError:
            raise CheckpointException(
                f"missing shard file {where} (written by rank "
                f"{info.get('rank')}; needed for tensor {key!r})") from None
        if size != info["size"]:
            raise CheckpointException(
                f"{where} is truncated or altered: {size} bytes, the "
                f"metadata says {info['size']} (needed for tensor {key!r})")
        hcrc = _file_header_crc(where, size)
        if hcrc != info["header_crc32"]:
            raise CheckpointException(
                f"{where}: checksum mismatch: header CRC-32 {hcrc}, the "
                f"metadata says {info['header_crc32']} (a file from another "
                f"checkpoint? needed for tensor {key!r})")
        try:
            loaded = S.load(where, mmap=True)
        except S.SerializationError as e:
            raise CheckpointException(f"{e} (needed for tensor {key!r})") \
                from None
        return {n: t._data for n, t in loaded.items()}


def _pick_rank(per_rank, rank, key, warn):
    if str(rank) in per_rank:
        return per_rank[str(rank)]
    r0 = min(per_rank, key=int)
    warn.append(key)
    return per_rank[r0]


def _assemble(key, entry, target, rank, reader, warn):
    """This rank's box of tensor ``key`` as an array (a temporary).

    A flat entry (ZeRO's element-wise shards: a 1-D tensor of the
    parameter's elements, ``flat_of`` its shape) and a tensor of that
    shape read each other, through the whole tensor, reshaped."""
    shape = tuple(target.shape)
    g, o = _spec(target, shape)
    t_flat = getattr(target, "_dcp_flat_of", None)
    s_flat = entry.get("flat_of")
    size = list(entry["size"])
    if t_flat is None and s_flat is not None and list(g) == s_flat:
        whole = _assemble_box(key, entry, (0,), (math.prod(g),), rank,
                              reader, warn).reshape(g)
        return whole[tuple(slice(a, a + n) for a, n in zip(o, shape))]
    if t_flat is not None and s_flat is None and size == list(t_flat):
        whole = _assemble_box(key, entry, (0,) * len(size), tuple(size),
                              rank, reader, warn).reshape(-1)
        return whole[o[0]:o[0] + shape[0]]
    if list(g) != size or (t_flat is not None and s_flat is not None
                           and list(t_flat) != s_flat):
        raise CheckpointException(
            f"size mismatch for {key!r}: the checkpoint "
            f"{reader.path} has shape {entry['size']}, the state_dict's "
            f"tensor is {list(g)}" + (f" (this rank's shard {list(shape)})"
                                      if tuple(g) != shape else ""))
    return _assemble_box(key, entry, o, shape, rank, reader, warn)


def _assemble_box(key, entry, o, shape, rank, reader, warn):
    """The box at offsets ``o`` of ``shape`` from the saved chunks."""
    chunks = entry.get("chunks")
    if chunks is None:
        chunks = _pick_rank(entry["per_rank"], rank, key, warn)
    want = S._DTYPES.get(entry["dtype"])
    out, covered = None, 0
    for c in chunks:
        lo, hi, hit = _overlap(o, shape, c["offsets"], c["sizes"])
        if not hit and math.prod(shape) > 0:
            continue
        src = reader.get(c["file"], c["name"], key)
        if list(src.shape) != list(c["sizes"]) or src.dtype != want:
            raise CheckpointException(
                f"{os.path.join(reader.path, c['file'])}: tensor {key!r} "
                f"is {src.dtype}{list(src.shape)}, the metadata says "
                f"{entry['dtype']}{c['sizes']}")
        if list(c["offsets"]) == list(o) and tuple(c["sizes"]) == shape:
            return src          # the whole box in one chunk: no copy yet
        if out is None:
            out = np.empty(shape, src.dtype)
        dst_idx = tuple(slice(l - oi, h - oi) for l, h, oi in zip(lo, hi, o))
        src_idx = tuple(slice(l - ci, h - ci)
                        for l, h, ci in zip(lo, hi, c["offsets"]))
        out[dst_idx] = src[src_idx]
        covered += math.prod(h - l for l, h in zip(lo, hi))
    if math.prod(shape) == 0:
        return np.empty(shape, want)
    if covered != math.prod(shape):
        raise CheckpointException(
            f"tensor {key!r}: the checkpoint {reader.path} covers {covered} "
            f"of the {math.prod(shape)} elements of this rank's box "
            f"(offsets {list(o)}, shape {list(shape)})")
    return out


def _copy_in(target, arr):
    dst = target._data
    if B.is_cupy_array(dst):
        xp = B.get_array_module(dst)
        with B.device_guard(dst):
            dst[...] = xp.asarray(arr).astype(dst.dtype, copy=False)
    else:
        dst[...] = arr
    if isinstance(target, Tensor):
        target._bump_version()


def load(state_dict, *, checkpoint_id=None, storage_reader=None,
         planner=None, process_group=None, no_dist=False):
    """Load a checkpoint into ``state_dict`` in place: its tensors get
    their values (whatever world size or sharding saved them), other
    values are replaced, Stateful objects get ``load_state_dict``. Every
    rank of the group calls it. ``checkpoint_id`` is a checkpoint
    directory, or a folder of them (its ``latest``). Any problem (missing
    key or file, checksum mismatch, truncated file, shape that differs)
    raises CheckpointException on every rank and changes nothing. Tensors
    take the state_dict's dtype (copied with a cast if the checkpoint's
    differs). A Stateful's own ``load_state_dict`` runs last, after the
    tensors are in: an error it raises (e.g. a sampler for another
    dataset) comes after they changed."""
    if checkpoint_id is None and storage_reader is not None:
        checkpoint_id = getattr(storage_reader, "path", None)
    if checkpoint_id is None:
        raise ValueError("dcp.load: pass checkpoint_id (a directory)")
    base = _base_group(process_group, no_dist)
    ck = _ckpt_group(base)
    _wait_pending(ck)        # never read while our own save is writing
    return _load(state_dict, checkpoint_id, ck)


def _load(state_dict, checkpoint_id, ck):
    rank = _rank(ck)
    temps, err, warn = {}, None, []
    path = os.fspath(checkpoint_id)
    try:
        flat = _Flat(state_dict)
        path = latest_checkpoint(path) or path
        meta = _read_metadata(path)
        reader = _Reader(path, meta)
        entries = meta.raw["state_dict_metadata"]
        for key, (_, _, v) in flat.leaves.items():
            e = entries.get(key)
            if e is None:
                raise CheckpointException(
                    f"missing key {key!r}: the checkpoint {path} has no "
                    "such entry")
            if _is_tensor(v) != (e["type"] == "tensor"):
                raise CheckpointException(
                    f"{key!r} is a {'tensor' if _is_tensor(v) else 'value'}"
                    f" in the state_dict but a {e['type']} in {path}")
            if _is_tensor(v):
                temps[key] = _assemble(key, e, v, rank, reader, warn)
            else:
                text = e["value"] if "value" in e else _pick_rank(
                    e["per_rank"], rank, key, warn)
                temps[key] = _decode_object(
                    text, f"{path}/{M.METADATA_NAME} ({key!r})")
    except Exception as e:
        err = str(e) if isinstance(e, CheckpointException) \
            else f"{type(e).__name__}: {e}"
    results = _gather(ck, {"err": err})
    _raise_failures(results, f"dcp.load from {path} (nothing was loaded)")
    if warn:
        warnings.warn(
            f"dcp.load: rank {rank} was not in the {meta.world_size}-rank "
            f"world that saved {path}; these per-rank entries come from the "
            f"lowest saving rank: {sorted(set(warn))[:8]}", stacklevel=3)
    for key, (parent, slot, v) in flat.leaves.items():
        if _is_tensor(v):
            _copy_in(v if isinstance(v, Tensor) else Tensor._wrap(v),
                     temps[key])
        else:
            parent[slot] = temps[key]
    for obj, sub in flat.statefuls:
        if _is_module(obj):
            set_model_state_dict(obj, sub)
        else:
            obj.load_state_dict(sub)
    return meta
