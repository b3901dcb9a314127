"""The checkpoint directory on disk: a rank's shard file, the commit
(``.metadata`` and the atomic swap into place, with a hook after each
step for the crash tests), stale temporaries, and finding the newest
complete checkpoint of a folder."""
import contextlib
import inspect
import json
import os
import re
import shutil
import socket
import zlib

from ... import serialization as S
from . import metadata as M


_NAME_OK = re.compile(r'^[^"\\\x00-\x1f]+$').match
# a save's temporary directory; ".old": where saves before the fixed
# _old_path name moved the checkpoint they replaced
_TMP_RE = re.compile(
    r"^\.(.*)\.dcp-([0-9a-f]{8})-([0-9]+)-[0-9a-f]{8}\.(tmp|old)$")
# the header's own CRC-32 entry, as dtorch.serialization writes it
_HCRC = re.compile(re.escape(json.dumps(S._HEADER_CRC_KEY).encode())
                   + rb':"([0-9a-f]{8})"')


def _tensor_name(key):
    """The safetensors name of a key: the key itself, unless it has a
    character that the header's checksum table cannot hold."""
    if _NAME_OK(key):
        return key
    return re.sub(r'["\\\x00-\x1f%]', lambda m: "%%%02x" % ord(m.group()),
                  key)


# serialization's writer hashes each piece just before writing it (one
# pass over the data) when it may seek back to put the header in last
_SEEKABLE = "seekable" in inspect.signature(S._write).parameters


def _write_file(path, arrays, sync=True):
    """One safetensors file through dtorch.serialization's writer (with
    its per-tensor checksums); returns (size, header CRC-32)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                 | getattr(os, "O_CLOEXEC", 0), 0o666)
    with os.fdopen(fd, "wb") as fh:
        if _SEEKABLE:
            S._write(fh, arrays, {"format": M.FORMAT}, seekable=True)
        else:
            S._write(fh, arrays, {"format": M.FORMAT})
        fh.flush()
        if sync:
            os.fsync(fh.fileno())
    size = os.path.getsize(path)
    return size, _file_header_crc(path, size)


def _fsync_dir(folder):
    S._fsync_dir(folder)


def _host_tag():
    return "%08x" % zlib.crc32(socket.gethostname().encode())


def _remove_stale_tmps(parent):
    """Temporary checkpoint directories of saves that died (this host,
    pid gone); other hosts' are left alone (they may be live). An
    earlier version's ``.old`` becomes the checkpoint's ``.old`` when it
    may be the only copy (its name is missing), else it goes too."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        m = _TMP_RE.match(name)
        if m is None or m.group(2) != _host_tag():
            continue
        pid = int(m.group(3))
        if pid == os.getpid() or S._pid_alive(pid):
            continue
        where = os.path.join(parent, name)
        target = os.path.join(parent, m.group(1))
        if m.group(4) == "old" and not os.path.lexists(target) and \
                not os.path.lexists(_old_path(target)) and _complete(where):
            os.rename(where, _old_path(target))
        else:
            _remove_checkpoint(where)


def _commit(path, tmp, entries, results, plans, per_rank_keys, sync=True):
    files = {}
    for r, x in enumerate(results):
        if x.get("file"):
            name, size, hcrc = x["file"]
            files[name] = {"size": size, "header_crc32": hcrc, "rank": r}
    layout = {}
    for k, e in entries.items():
        chunks = e.get("chunks")
        if e["type"] == "tensor":
            for c in chunks or [c for cs in e["per_rank"].values()
                                for c in cs]:
                c["file"] = f"__{c['rank']}_0.safetensors"
                c["name"] = _tensor_name(k)
            if chunks is not None and len(chunks) > 1:
                layout[k] = [c["offsets"] for c in chunks]
    steps = {p["step"] for p in plans}
    world = len(plans)
    doc = {"format": M.FORMAT, "world_size": world,
           "step": steps.pop() if len(steps) == 1 else None,
           "layout": {"sharded": layout, "per_rank": per_rank_keys},
           "files": files, "state_dict_metadata": entries}
    mpath = os.path.join(tmp, M.METADATA_NAME)
    with open(mpath, "wb") as fh:
        fh.write(M.dumps(doc))
        fh.flush()
        if sync:
            os.fsync(fh.fileno())
    if sync:
        _fsync_dir(tmp)
    _step("written")
    _swap_in(path, tmp, sync)


# The commit's steps, in order; ``_commit_hook(step)`` (None outside tests)
# runs after each, so a test can kill the process there.
COMMIT_STEPS = ("written", "stale-old-removed", "moved-aside", "renamed",
                "synced", "old-unmarked", "old-removed")
_commit_hook = None


def _step(name):
    if _commit_hook is not None:
        _commit_hook(name)


def _old_path(path):
    """Where a save moves the checkpoint it replaces, for the instant
    between its two renames: one fixed name per checkpoint, so load,
    latest_checkpoint and the next save find it after a crash there."""
    parent, base = os.path.split(path)
    if len(base) > 200:        # keep the name within NAME_MAX
        base = f"{base[:180]}.{zlib.crc32(base.encode()):08x}"
    return os.path.join(parent, f".{base}.old")


def _complete(path):
    return os.path.isfile(os.path.join(path, M.METADATA_NAME))


def _found(path):
    """The complete checkpoint that the name ``path`` stands for: ``path``
    itself, or (a save was killed between its renames) its ``.old``."""
    if _complete(path):
        return path
    old = _old_path(path)
    if not os.path.lexists(path) and _complete(old):
        return old
    return None


def _remove_checkpoint(path, step=None):
    """Remove a checkpoint directory (or a file or link of that name).
    Its .metadata goes first: a removal cut short leaves no directory
    that looks complete."""
    if os.path.isdir(path) and not os.path.islink(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(path, M.METADATA_NAME))
        if step:
            _step(step)
        shutil.rmtree(path, ignore_errors=True)
    else:        # a file (a dtorch.save checkpoint) or a link
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _swap_in(path, tmp, sync):
    """Put the complete directory ``tmp`` in place as ``path``: at every
    instant a complete checkpoint is under the name or, between the two
    renames, under its ``.old`` (see _found)."""
    old = _old_path(path)
    if os.path.lexists(old):
        if os.path.lexists(path):
            _remove_checkpoint(old)  # stale: a kill after the renames
        # else a kill between the renames: the .old is the current
        # checkpoint until the new one is in place
    _step("stale-old-removed")
    moved = os.path.lexists(path)
    if moved:
        os.rename(path, old)
    _step("moved-aside")
    try:
        os.rename(tmp, path)
    except OSError:
        if moved:              # put the previous checkpoint back
            os.rename(old, path)
        raise
    _step("renamed")
    if sync:
        _fsync_dir(os.path.dirname(path))
    _step("synced")
    if os.path.lexists(old):
        _remove_checkpoint(old, "old-unmarked")
    _step("old-removed")


def latest_checkpoint(root):
    """The newest complete checkpoint under ``root``: the one its
    ``latest`` file names, else the highest-numbered ``*_<step>``
    directory with a ``.metadata``; ``root`` itself if it is one; None
    if there is none. A name whose save was killed between its two
    renames stands for its ``.NAME.old``, the previous checkpoint."""
    root = os.fspath(root)
    found = _found(root)
    if found is not None:
        return found
    try:
        with open(os.path.join(root, "latest")) as fh:
            name = fh.read().strip()
        found = M.plain_name(name) and _found(os.path.join(root, name))
        if found:
            return found
    except OSError:
        pass
    best = None
    try:
        names = os.listdir(root)
    except OSError:
        return None
    # a NAME whose save was killed between its renames is there as .NAME.old
    names = {m.group(1) if m else n for n in names
             for m in [re.match(r"^\.(.+)\.old$", n)]}
    for name in names:
        m = re.match(r"^[^.].*?(\d+)$", name)
        found = m and _found(os.path.join(root, name))
        if found and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), found)
    return None if best is None else best[1]


def _read_metadata(path):
    where = os.path.join(path, M.METADATA_NAME)
    try:
        with open(where, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no distributed checkpoint at {path!r} (no {M.METADATA_NAME} "
            "file: not a checkpoint, or a save that never completed)"
        ) from None
    return M.loads(raw, where)


def _file_header_crc(path, size):
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        raw = fh.read(min(n, size, S._MAX_HEADER))
    m = _HCRC.search(raw)
    return m.group(1).decode() if m else None



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
        return _read_metadata(latest_checkpoint(self.path) or self.path)
