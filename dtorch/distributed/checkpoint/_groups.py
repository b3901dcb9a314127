"""The checkpoint group (collectives on the same ranks as the training
group, made at the first save or load: async_save's background thread
talks only on it, so it never interleaves with training's collectives on
the default group), the background save queue, and the exchange that
turns any rank's error into a CheckpointException on every rank."""
import concurrent.futures
import contextlib
import os
import threading
import weakref

from .. import _default_or_none
from ._shards import CheckpointException


_groups = weakref.WeakKeyDictionary()   # base group -> checkpoint group
_pending = {}             # id(checkpoint group) -> last async Future
_staging = {}             # id(checkpoint group) -> {key: host buffer}
_groups_lock = threading.Lock()


def _base_group(process_group, no_dist):
    if no_dist:
        return None
    g = process_group if process_group is not None else _default_or_none()
    if g is None or g.size == 1:
        return None
    return g


def _ckpt_group(base):
    """The checkpoint's own group over ``base``'s ranks (a collective the
    first time, in the caller's thread, on every rank)."""
    if base is None:
        return None
    with _groups_lock:
        hit = _groups.get(base)
    if hit is not None:
        return hit
    ck = base.new_group(list(base.ranks))
    with _groups_lock:
        _groups[base] = ck
    return ck


def _gather(ck, obj):
    return [obj] if ck is None else ck.all_gather_object(obj)


def _rank(ck):
    return 0 if ck is None else ck.rank


def _key(ck):
    return "solo" if ck is None else id(ck)


def _submit(ck, fn, *args):
    """Run ``fn(*args)`` on a new thread after the group's previous
    background save; returns its Future. Non-daemon: an interpreter that
    exits waits for the save in flight."""
    fut = concurrent.futures.Future()
    key = _key(ck)
    with _groups_lock:
        prev = _pending.get(key)
        _pending[key] = fut

    def run():
        # below the training thread: on a busy host the write waits, not
        # the step (Linux: a thread's own nice value, by its id)
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                           min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10))
        if prev is not None:
            concurrent.futures.wait([prev])
        fut.set_running_or_notify_cancel()
        try:
            fut.set_result(fn(*args))
        except BaseException as e:   # delivered by fut.result()
            fut.set_exception(e)
        finally:
            with _groups_lock:
                if _pending.get(key) is fut:
                    del _pending[key]
    threading.Thread(target=run, name="dcp-async-save").start()
    return fut


def _wait_pending(ck):
    """Block until the group's background saves are done (their errors
    stay with their futures)."""
    with _groups_lock:
        prev = _pending.get(_key(ck))
    if prev is not None:
        concurrent.futures.wait([prev])


def _raise_failures(results, what):
    bad = {r: x["err"] for r, x in enumerate(results) if x.get("err")}
    if bad:
        lines = "\n".join(f"  rank {r}: {m}" for r, m in sorted(bad.items()))
        raise CheckpointException(f"{what} failed on {len(bad)} of "
                                  f"{len(results)} ranks:\n{lines}", bad)
