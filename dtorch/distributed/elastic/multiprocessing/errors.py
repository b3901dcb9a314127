"""``torch.distributed.elastic.multiprocessing.errors``: the ``@record``
decorator of torchrun scripts and the failure types around it.

``@record`` on a script's ``main``: an exception that escapes it is written
to the file named by ``TORCHELASTIC_ERROR_FILE`` (when set) as PyTorch's
JSON, ``{"message": {"message": "Type: text", "extraInfo":
{"py_callstack": traceback, "timestamp": "seconds"}}}``, and raised again.
``SystemExit(0)`` returns None (a script run with ``run_path`` ends
normally); another ``SystemExit`` passes through unrecorded. A
``ChildFailedError`` (a launcher-like main whose child failed) copies the
first failed child's error file into this process's, with the child's exit
code as ``errorCode``. Without the variable nothing is written (PyTorch
logs only)."""
import faulthandler
import functools
import json
import os
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["ChildFailedError", "ErrorHandler", "ProcessFailure",
           "get_error_handler", "record"]

_NOT_AVAILABLE = "<N/A>"


class ErrorHandler:
    """Writes a process's error file (``TORCHELASTIC_ERROR_FILE``)."""

    def _get_error_file_path(self):
        return os.environ.get("TORCHELASTIC_ERROR_FILE", None)

    def initialize(self):
        """Tracebacks of every thread on a fatal signal (faulthandler)."""
        try:
            faulthandler.enable(all_threads=True)
        except Exception as e:      # no usable stderr (a daemon)
            warnings.warn(f"Unable to enable fault handler. "
                          f"{type(e).__name__}: {e}", stacklevel=2)

    def record_exception(self, e):
        path = self._get_error_file_path()
        if not path:
            return
        data = {"message": {
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {"py_callstack": traceback.format_exc(),
                          "timestamp": str(int(time.time()))}}}
        with open(path, "w") as f:
            json.dump(data, f)

    def dump_error_file(self, rootcause_error_file, error_code=0):
        """Copy a child's error file into this process's (the child's
        ``error_code`` set as ``errorCode``: a child killed by a signal
        could not write it)."""
        with open(rootcause_error_file) as f:
            data = json.load(f)
        if error_code and isinstance(data.get("message"), dict):
            data["message"]["errorCode"] = error_code
        path = self._get_error_file_path()
        if not path:
            print(f"no error file defined for parent, to copy child error "
                  f"file ({rootcause_error_file})", file=sys.stderr)
            return
        if os.path.isfile(path):
            os.remove(path)
        with open(path, "w") as f:
            f.write(json.dumps(data))


def get_error_handler():
    return ErrorHandler()


@dataclass
class ProcessFailure:
    """A failed child: ``local_rank``, ``pid``, ``exitcode`` (negative: the
    signal) and ``error_file``; ``message`` and ``timestamp`` come from the
    error file if the child wrote one (``error_file`` is ``"<N/A>"`` if
    not)."""
    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    error_file_data: dict = field(init=False)
    message: object = field(init=False)
    timestamp: int = field(init=False)

    def __post_init__(self):
        self.error_file_data = {"message": ""}
        self.message, self.timestamp = "", int(time.time())
        if os.path.isfile(self.error_file):
            with open(self.error_file) as f:
                self.error_file_data = json.load(f)
            msg = self.error_file_data["message"]
            self.message = msg
            self.timestamp = int(self.error_file_data.get("timestamp", 0)
                                 if isinstance(msg, str)
                                 else msg["extraInfo"]["timestamp"])
        else:
            self.error_file = _NOT_AVAILABLE
        if not self.message:
            self.message = (
                f"Signal {-self.exitcode} ({self.signal_name()}) received "
                f"by PID {self.pid}" if self.exitcode < 0 else
                "no error file: decorate the script's main with "
                "@record for its traceback")

    def signal_name(self):
        try:
            return signal.Signals(-self.exitcode).name \
                if self.exitcode < 0 else _NOT_AVAILABLE
        except ValueError:
            return _NOT_AVAILABLE

    def timestamp_isoformat(self):
        return datetime.fromtimestamp(self.timestamp).isoformat(sep="_")


class ChildFailedError(Exception):
    """``ChildFailedError(name, failures)``: child processes of ``name``
    failed; ``failures`` maps a global rank to its ``ProcessFailure``."""

    def __init__(self, name, failures):
        if not failures:
            raise ValueError("ChildFailedError needs at least one failure")
        self.name, self.failures = name, failures
        super().__init__(self.format_msg())

    def get_first_failure(self):
        rank = min(self.failures, key=lambda r: self.failures[r].timestamp)
        return rank, self.failures[rank]

    def format_msg(self, boarder_delim="=", section_delim="-"):
        first, _ = self.get_first_failure()
        lines = [boarder_delim * 60, f"{self.name} FAILED",
                 section_delim * 60]
        for rank in [first] + sorted(r for r in self.failures
                                     if r != first):
            f = self.failures[rank]
            msg = f.message
            if isinstance(msg, dict):
                msg = msg.get("extraInfo", {}).get(
                    "py_callstack", msg.get("message", _NOT_AVAILABLE))
            lines.append(
                f"{'root cause' if rank == first else 'also'}: rank {rank} "
                f"(local_rank {f.local_rank}, pid {f.pid}) exitcode "
                f"{f.exitcode} at {f.timestamp_isoformat()}, error_file "
                f"{f.error_file}:\n{msg}")
        lines.append(boarder_delim * 60)
        return "\n".join(lines)


def record(fn, error_handler=None):
    """Decorate a script's main: an uncaught exception goes to the error
    file as JSON, then is raised again (module docstring)."""
    handler = error_handler or get_error_handler()

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        handler.initialize()
        try:
            return fn(*args, **kwargs)
        except SystemExit as e:
            if e.code == 0:
                return None
            raise
        except ChildFailedError as e:
            _, failure = e.get_first_failure()
            if failure.error_file != _NOT_AVAILABLE:
                handler.dump_error_file(failure.error_file, failure.exitcode)
            raise
        except Exception as e:
            handler.record_exception(e)
            raise
    return wrapper
