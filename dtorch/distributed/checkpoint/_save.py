"""dcp.save / dcp.async_save (see the package docstring for the user's
view, metadata.py for the file format).

Save, on every rank of the group, in order:
1. flatten the state_dict to ``{dotted key: leaf}``, calling
   ``state_dict()`` of Stateful objects (a Module through
   ``get_model_state_dict``, so tensor-parallel shards carry their place);
2. plan (all_gather_object): each rank sends, per tensor, its box of
   the global tensor, per object its JSON; for the boxes that several
   ranks hold, a second exchange sends their checksums. Every rank then
   computes the same plan: a box held by several ranks with equal bytes
   (a replicated tensor) is written once, by the lowest of them; a tensor
   whose bytes differ between ranks (per-rank state, e.g. a per-rank RNG
   tensor) is written by every rank, as are objects that differ;
3. write this rank's file (safetensors via dtorch.serialization's writer,
   with its per-tensor checksums) into a temporary directory;
4. all_gather_object of every rank's result: a barrier that also carries
   errors. Rank 0 writes ``.metadata`` and renames the directory into
   place (_swap_in: a checkpoint it replaces waits under ``.NAME.old``
   between the two renames, where load, latest_checkpoint and the next
   save find it after a crash). A last exchange tells every rank whether
   the commit happened.
"""
import os
import shutil

from ._files import (_commit, _host_tag, _remove_stale_tmps, _tensor_name,
                     _write_file)
from ._flatten import _Flat
from ._groups import (_base_group, _ckpt_group, _gather, _groups_lock,
                      _key, _pending, _raise_failures, _rank, _staging,
                      _submit, _wait_pending)
from ._plan import _global_plan, _plan_of, _replica_checksums, _Snapshot
from ._shards import CheckpointException


def _save_snapshot(snap, path, ck, after_commit=None):
    """Steps 2-4 of a save (any thread; collectives on ``ck`` only)."""
    rank = _rank(ck)
    path = os.path.abspath(os.fspath(path))
    parent, base = os.path.dirname(path), os.path.basename(path)
    mine = {"err": None}
    tmp = None
    try:
        mine["plan"] = _plan_of(snap)
        if rank == 0:
            os.makedirs(parent, exist_ok=True)
            _remove_stale_tmps(parent)
            tmp = os.path.join(parent, f".{base[:180]}.dcp-{_host_tag()}-"
                               f"{os.getpid()}-{os.urandom(4).hex()}.tmp")
            os.mkdir(tmp)
            mine["tmp"] = tmp
    except Exception as e:
        mine["err"] = f"{type(e).__name__}: {e}"
    try:
        plans = _gather(ck, mine)
    except BaseException:          # a rank died: drop our partial files
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    tmp = plans[0].get("tmp")
    try:
        _raise_failures(plans, f"dcp.save to {path} (planning)")
        plans = [p["plan"] for p in plans]
        crcs = _replica_checksums(snap, plans, ck, rank)
        try:
            entries, writes, per_rank_keys = _global_plan(plans, crcs)
        except ValueError as e:
            # the same on every rank: the plan is computed alike everywhere
            raise CheckpointException(f"dcp.save to {path}: {e}") from None
    except BaseException:
        if rank == 0 and tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    # 3. write this rank's file
    res = {"err": None}
    fname = f"__{rank}_0.safetensors"
    try:
        if writes[rank]:
            arrays = {_tensor_name(k): snap.tensors[k][0]
                      for k in writes[rank]}
            size, hcrc = _write_file(os.path.join(tmp, fname), arrays,
                                     snap.sync)
            res["file"] = [fname, size, hcrc]
    except Exception as e:
        res["err"] = f"writing {os.path.join(tmp, fname)}: " \
                     f"{type(e).__name__}: {e}"
    try:
        results = _gather(ck, res)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    commit = {"err": None}
    if rank == 0:
        try:
            _raise_failures(results, f"dcp.save to {path}")
            _commit(path, tmp, entries, results, plans, per_rank_keys,
                    snap.sync)
            if after_commit is not None:
                after_commit(path)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            commit["err"] = str(e) if isinstance(e, CheckpointException) \
                else f"{type(e).__name__}: {e}"
    done = _gather(ck, commit)
    _raise_failures(done[:1], f"dcp.save to {path} (commit)")
    return path


def _prepare(state_dict, process_group, no_dist, copy, writer):
    base = _base_group(process_group, no_dist)
    ck = _ckpt_group(base)
    flat = _Flat(state_dict)
    err = None
    staging = None
    if copy and getattr(writer, "cache_staged_state_dict", False):
        # the previous snapshot's buffers, unless a save still reads them
        # (memory already faulted in: the copy runs at memcpy speed)
        with _groups_lock:
            if _key(ck) not in _pending:
                staging = _staging.setdefault(_key(ck), {})
    try:
        snap = _Snapshot(flat, copy, staging)
        # FileSystemWriter(sync_files=False): no fsync (PyTorch's option)
        snap.sync = bool(getattr(writer, "sync_files", True))
    except Exception as e:
        err, snap = e, None
    return ck, snap, err


def _checkpoint_path(checkpoint_id, storage_writer):
    if checkpoint_id is None and storage_writer is not None:
        checkpoint_id = getattr(storage_writer, "path", None)
    if checkpoint_id is None:
        raise ValueError("dcp: pass checkpoint_id (a directory)")
    return os.fspath(checkpoint_id)


def save(state_dict, *, checkpoint_id=None, storage_writer=None,
         planner=None, process_group=None, no_dist=False, _after_commit=None):
    """Save ``state_dict`` as a distributed checkpoint in the directory
    ``checkpoint_id``; every rank of the group calls it. Returns the
    checkpoint's path. Each rank writes only what it owns
    (replicated tensors once); the directory appears complete or not at
    all. ``storage_writer``/``planner`` are PyTorch's extension points;
    only a writer with a ``path`` is understood."""
    path = _checkpoint_path(checkpoint_id, storage_writer)
    ck, snap, err = _prepare(state_dict, process_group, no_dist, False,
                             storage_writer)
    _wait_pending(ck)        # saves of a group run in call order
    return _save_or_fail(snap, err, path, ck, _after_commit)


def _save_or_fail(snap, err, path, ck, after_commit):
    if err is not None:
        # the other ranks are in the plan exchange: answer with the error
        msg = f"{type(err).__name__}: {err}"
        res = _gather(ck, {"err": msg})
        if _rank(ck) == 0 and res[0].get("tmp"):
            shutil.rmtree(res[0]["tmp"], ignore_errors=True)
        _raise_failures(res, f"dcp.save to {path} (planning)")
    return _save_snapshot(snap, path, ck, after_commit)


def async_save(state_dict, *, checkpoint_id=None, storage_writer=None,
               planner=None, process_group=None, no_dist=False,
               _after_commit=None):
    """As ``save``, but returns at once with a
    ``concurrent.futures.Future``: the state is copied (to host memory)
    now, so training may change it right after, and a background thread
    writes it; ``future.result()`` returns the path or raises
    CheckpointException. Saves of one group run in call order."""
    path = _checkpoint_path(checkpoint_id, storage_writer)
    ck, snap, err = _prepare(state_dict, process_group, no_dist, True,
                             storage_writer)
    return _submit(ck, _save_or_fail, snap, err, path, ck, _after_commit)
