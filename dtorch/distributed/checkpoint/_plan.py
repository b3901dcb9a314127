"""Planning a save: this rank's snapshot (host arrays with their boxes,
JSON objects), its part of the plan, the checksums that tell a replica
from per-rank state, and the global plan every rank computes alike (who
writes which chunk; the metadata's entries)."""
import math

import numpy as np

from ... import _backend as B
from ... import serialization as S
from ._flatten import _encode_object
from ._groups import _gather, _raise_failures
from ._shards import _array, _is_tensor, _overlap, _spec


def _host_array(a, copy, buf=None):
    """A host, C-contiguous, little-endian array (a copy if ``copy``:
    into ``buf`` when it has the shape and dtype)."""
    if B.is_cupy_array(a):
        if buf is not None and buf.shape == a.shape and \
                buf.dtype == a.dtype:
            return a.get(out=buf)
        return a.get()         # already a fresh host copy
    if a.dtype not in S._LITTLE or not a.flags.c_contiguous:
        return S._Encoder._convert(a, "tensor")
    if not copy:
        return a
    if buf is not None and buf.shape == a.shape and buf.dtype == a.dtype:
        np.copyto(buf, a)
        return buf
    return np.array(a, copy=True)


def _checksum(a):
    sums = S._Checksums()
    sums.add("x", S._bytes_of(a))
    return sums.crc["x"]


class _Snapshot:
    """What one rank saves: host arrays with their boxes, JSON objects."""

    def __init__(self, flat, copy, staging=None):
        self.tensors = {}          # key -> (array, global, offsets)
        self.objects = {}          # key -> JSON text
        self.flat_of = {}          # key -> shape of a flat shard's tensor
        for key, (_, _, v) in flat.leaves.items():
            if _is_tensor(v):
                buf = None if staging is None else staging.get(key)
                a = _host_array(_array(v), copy, buf)
                if staging is not None:
                    staging[key] = a
                if a.dtype not in S._CODES:
                    raise TypeError(f"dcp: {key!r} has dtype {a.dtype}, "
                                    "which safetensors cannot store")
                g, o = _spec(v, a.shape)
                self.tensors[key] = (a, g, o)
                if getattr(v, "_dcp_flat_of", None) is not None:
                    self.flat_of[key] = list(v._dcp_flat_of)
            else:
                self.objects[key] = _encode_object(key, v)
        self.step = None
        self.sync = True
        st = flat.leaves.get("step")
        if st is not None and isinstance(st[2], (int, np.integer)) \
                and not isinstance(st[2], bool):
            self.step = int(st[2])


def _plan_of(snap):
    """This rank's part of the plan (JSON-able)."""
    return {"tensors": {k: [S._CODES[a.dtype], list(g), list(o),
                            list(a.shape)]
                        for k, (a, g, o) in snap.tensors.items()},
            "flat_of": dict(snap.flat_of),
            "objects": dict(snap.objects), "step": snap.step}


def _shared(plans):
    """{key: ranks} of the tensors whose box another rank holds too: only
    these need a checksum before writing, to tell a replica (written
    once) from per-rank state (written by each); the others are hashed
    as they are written."""
    boxes = {}
    for r, p in enumerate(plans):
        for k, (_, _, off, size) in p["tensors"].items():
            boxes.setdefault((k, tuple(off), tuple(size)), []).append(r)
    out = {}
    for (k, _, _), ranks in boxes.items():
        if len(ranks) > 1:
            out.setdefault(k, set()).update(ranks)
    return out


def _replica_checksums(snap, plans, ck, rank):
    """[{key: checksum}] by rank for the shared tensors (one exchange,
    only when some tensor is shared)."""
    shared = _shared(plans)
    if not shared:
        return [{} for _ in plans]
    mine = {"err": None, "crc": {}}
    try:
        mine["crc"] = {k: _checksum(snap.tensors[k][0])
                       for k, ranks in shared.items() if rank in ranks}
    except Exception as e:
        mine["err"] = f"{type(e).__name__}: {e}"
    res = _gather(ck, mine)
    _raise_failures(res, "dcp.save (checksums)")
    return [x["crc"] for x in res]


def _global_plan(plans, crcs):
    """The same plan on every rank: {rank: [keys it writes]} and the
    metadata's state_dict entries (chunk files filled in later).
    ``crcs[r]``: rank r's checksums of its shared tensors."""
    entries, writes, per_rank_keys = {}, {r: [] for r in range(len(plans))}, []
    order = []
    for p in plans:
        for k in list(p["tensors"]) + list(p["objects"]):
            if k not in entries:
                entries[k] = None
                order.append(k)
    for k in order:
        holders = [r for r, p in enumerate(plans) if k in p["tensors"]]
        objs = [r for r, p in enumerate(plans) if k in p["objects"]]
        if holders and objs:
            raise ValueError(f"key {k!r} is a tensor on ranks {holders} but "
                             f"not on ranks {objs}")
        if objs:
            vals = {r: plans[r]["objects"][k] for r in objs}
            if len(set(vals.values())) == 1:
                entries[k] = {"type": "object", "value": vals[objs[0]]}
            else:
                entries[k] = {"type": "object", "per_rank": {
                    str(r): v for r, v in vals.items()}}
            continue
        info = {r: plans[r]["tensors"][k] + [crcs[r].get(k)]
                for r in holders}
        dtypes = {r: i[0] for r, i in info.items()}
        sizes = {r: tuple(i[1]) for r, i in info.items()}
        if len(set(dtypes.values())) > 1 or len(set(sizes.values())) > 1:
            raise ValueError(
                f"tensor {k!r} differs between ranks: dtypes {dtypes}, "
                f"global shapes {sizes}")
        boxes = {}
        for r, (_, _, off, size, crc) in info.items():
            boxes.setdefault((tuple(off), tuple(size)), {})[r] = crc
        per_rank = any(len(set(c.values())) > 1 for c in boxes.values())
        dtype, gsize = info[holders[0]][0], list(info[holders[0]][1])
        if per_rank:
            per_rank_keys.append(k)
            entries[k] = {"type": "tensor", "dtype": dtype, "size": gsize,
                          "per_rank": {}}
            for r, (_, _, off, size, _) in info.items():
                entries[k]["per_rank"][str(r)] = [
                    {"offsets": off, "sizes": size, "rank": r}]
                writes[r].append(k)
            continue
        chunks = []
        for (off, size), held in boxes.items():
            w = min(held)
            chunks.append({"offsets": list(off), "sizes": list(size),
                           "rank": w})
            writes[w].append(k)
        _check_tiling(k, gsize, chunks)
        entries[k] = {"type": "tensor", "dtype": dtype, "size": gsize,
                      "chunks": chunks}
        flats = {str(plans[r].get("flat_of", {}).get(k)) for r in holders}
        if len(flats) > 1:
            raise ValueError(f"tensor {k!r} is a flat shard on some ranks "
                             f"only ({sorted(flats)})")
        if plans[holders[0]].get("flat_of", {}).get(k) is not None:
            entries[k]["flat_of"] = plans[holders[0]]["flat_of"][k]
    return entries, writes, per_rank_keys


def _check_tiling(k, gsize, chunks):
    vol = 0
    for i, c in enumerate(chunks):
        vol += math.prod(c["sizes"])
        for d in chunks[:i]:
            if _overlap(c["offsets"], c["sizes"], d["offsets"],
                        d["sizes"])[2]:
                raise ValueError(
                    f"tensor {k!r}: the shards at offsets {c['offsets']} "
                    f"(rank {c['rank']}) and {d['offsets']} (rank "
                    f"{d['rank']}) overlap with different boxes")
    if vol != math.prod(gsize):
        raise ValueError(f"tensor {k!r}: the ranks' shards cover {vol} of "
                         f"its {math.prod(gsize)} elements (global shape "
                         f"{gsize})")
