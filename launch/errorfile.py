"""TORCHELASTIC_ERROR_FILE, as torchrun sets it: each rank gets a file of
its own to which ``@record`` (dtorch.distributed.elastic.multiprocessing.
errors) writes the exception that ended it, as PyTorch's JSON; when the
rank fails, the launcher names the root cause from that file instead of
guessing it from the last lines of output.

The files live in ``--log-dir`` (kept: ``rankN.error.json``) or in a
temporary directory removed when the launcher ends. A file left by an
earlier attempt is removed before the rank starts, so a file that exists
after a failure is that rank's own."""

import json
import os
import shutil
import tempfile
import time

VAR = "TORCHELASTIC_ERROR_FILE"


class ErrorFiles:
    def __init__(self, log_dir=None):
        self._temp = log_dir is None
        self.dir = tempfile.mkdtemp(prefix="dtorch-errors-") \
            if self._temp else log_dir
        self.paths = {}

    def path(self, rank, attempt=0):
        """The error file of `rank` (of restart `attempt`), cleared."""
        name = f"rank{rank}" + (f".restart{attempt}" if attempt else "")
        path = os.path.join(self.dir, name + ".error.json")
        try:
            os.remove(path)
        except OSError:
            pass
        self.paths[rank] = path
        return path

    def read(self, rank):
        """(message, traceback, path) that `rank` recorded, or None."""
        path = self.paths.get(rank)
        try:
            with open(path) as f:
                data = json.load(f)
        except (TypeError, OSError, ValueError):
            return None
        msg = data.get("message")
        if isinstance(msg, dict):
            info = msg.get("extraInfo") or {}
            stamp = info.get("timestamp")
            when = ""
            if str(stamp).isdigit():
                when = time.strftime(" at %H:%M:%S",
                                     time.localtime(int(stamp)))
            return (f"{msg.get('message', '?')}{when}",
                    info.get("py_callstack") or "", path)
        return (str(msg), "", path)

    def report(self, rank, say, stream, shown=()):
        """Print `rank`'s root cause through `say` (one line) and its
        recorded traceback on `stream`, unless the lines `shown` (the
        rank's output just printed) end with it; False if it left none."""
        got = self.read(rank)
        if got is None:
            return False
        message, stack, path = got
        say(f"root cause (from its error file {path}): {message}")
        last = stack.rstrip("\n").rsplit("\n", 1)[-1]
        if stack and not any(last and last in ln for ln in shown):
            stream.write("".join(f"    | {ln}\n"
                                 for ln in stack.rstrip("\n").split("\n")))
            stream.flush()
        return True

    def caused_by_peer(self, rank, marker):
        got = self.read(rank)
        return got is not None and marker in got[0]

    def close(self):
        if self._temp:
            shutil.rmtree(self.dir, ignore_errors=True)
