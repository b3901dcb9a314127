"""CheckpointManager: numbered checkpoints of a folder, the newest K kept,
a ``latest`` pointer."""
import os
import re
import shutil

from . import metadata as M
from ._files import FileSystemWriter, _fsync_dir, latest_checkpoint
from ._load import load
from ._save import async_save, save


class CheckpointManager:
    """Checkpoints ``root/step_<NNNNNNNN>`` with a ``latest`` pointer,
    keeping the newest ``keep_last`` (all when None). Collective: every
    rank calls save/load. ``cache_staged_state_dict`` (default True,
    unlike dcp.async_save's PyTorch default): async saves copy into the
    previous save's host buffers, keeping one more copy of the state in
    memory; the copy at call time then runs at memcpy speed (measured on
    a 1 GB state: 0.2-0.35 s instead of 6.8-9.5 s for fresh memory, whose
    first touch is what costs in a VM).

    Example::

        mgr = dcp.CheckpointManager("runs/ckpt", keep_last=3)
        step = mgr.load(state)            # None: no checkpoint yet
        ...
        fut = mgr.async_save(state, step=step)
    """

    def __init__(self, root, keep_last=None, prefix="step_",
                 cache_staged_state_dict=True):
        if keep_last is not None and int(keep_last) < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got "
                             f"{keep_last}")
        self.root, self.keep_last, self.prefix = os.fspath(root), \
            keep_last, prefix
        self.cache_staged_state_dict = cache_staged_state_dict

    def path(self, step):
        return os.path.join(self.root, f"{self.prefix}{int(step):08d}")

    def steps(self):
        """Steps of the complete checkpoints, oldest first."""
        out = []
        try:
            names = os.listdir(self.root)
        except OSError:
            return out
        for n in names:
            m = re.fullmatch(re.escape(self.prefix) + r"(\d+)", n)
            if m and os.path.isfile(os.path.join(self.root, n,
                                                 M.METADATA_NAME)):
                out.append(int(m.group(1)))
        return sorted(out)

    def latest(self):
        """The newest complete checkpoint's path, or None."""
        p = latest_checkpoint(self.root)
        return None if p == self.root else p

    def _after_commit(self, path):
        name = os.path.basename(path)
        tmp = os.path.join(self.root, f".latest.{os.getpid()}."
                           f"{os.urandom(4).hex()}")
        with open(tmp, "w") as fh:
            fh.write(name + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, os.path.join(self.root, "latest"))
        _fsync_dir(self.root)
        if self.keep_last is not None:
            for s in self.steps()[:-int(self.keep_last)]:
                if self.path(s) != path:
                    shutil.rmtree(self.path(s), ignore_errors=True)

    def save(self, state_dict, step, **kw):
        return save(state_dict, checkpoint_id=self.path(step),
                    _after_commit=self._after_commit, **kw)

    def async_save(self, state_dict, step, **kw):
        kw.setdefault("storage_writer", FileSystemWriter(
            self.path(step),
            cache_staged_state_dict=self.cache_staged_state_dict))
        return async_save(state_dict, checkpoint_id=self.path(step),
                          _after_commit=self._after_commit, **kw)

    def load(self, state_dict, step=None, **kw):
        """Load ``step`` (default: the latest) into ``state_dict``;
        returns the loaded checkpoint's step, or None when there is no
        checkpoint (nothing changed)."""
        path = self.path(step) if step is not None else self.latest()
        if path is None:
            return None
        meta = load(state_dict, checkpoint_id=path, **kw)
        m = re.search(r"(\d+)$", path)
        return meta.step if meta.step is not None else int(m.group(1))
