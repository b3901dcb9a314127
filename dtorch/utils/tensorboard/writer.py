"""``SummaryWriter``: scalars, histograms, text and images as TensorBoard
event files, with ``torch.utils.tensorboard.SummaryWriter``'s API and
default run directory (``runs/<date>_<host><comment>``).

The event file format and protobufs are the ``tensorboard`` package's
(``EventFileWriter``, ``event_pb2``, ``summary_pb2``), so any TensorBoard
reads the files. Images are PNG-encoded here with zlib (no Pillow needed).
"""
import os
import socket
import struct
import time
import zlib
from datetime import datetime

import numpy as np


def _tb():
    try:
        from tensorboard.summary.writer.event_file_writer import \
            EventFileWriter
        from tensorboard.compat.proto import event_pb2, summary_pb2
    except ImportError as e:
        raise ImportError(
            "dtorch.utils.tensorboard needs the tensorboard package: "
            "pip install tensorboard (or, in the dtorch clone, pip install "
            "-e '.[tensorboard]')"
        ) from e
    return EventFileWriter, event_pb2, summary_pb2


def _np(x):
    """A tensor, array or number as a NumPy array (float64 for floats)."""
    if hasattr(x, "detach") and hasattr(x, "_data"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _scalar(x):
    a = _np(x)
    if a.size != 1:
        raise ValueError(f"scalar should be 0D, got an array of shape "
                         f"{a.shape}")
    return float(a.reshape(()))


def _tf_bins():
    # TensorFlow's default histogram buckets: +-1e-12 * 1.1^k up to 1e20
    v = 1e-12
    pos = []
    while v < 1e20:
        pos.append(v)
        v *= 1.1
    pos = np.asarray(pos)
    return np.concatenate([-pos[::-1], [0.0], pos])


def _png(img):
    """PNG bytes of an HxWxC uint8 array (C in 1, 3, 4)."""
    h, w, c = img.shape
    color = {1: 0, 3: 2, 4: 6}[c]
    raw = np.concatenate([np.zeros((h, 1), np.uint8),
                          img.reshape(h, w * c)], 1).tobytes()

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + \
            struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def _image_hwc(img, dataformats):
    a = _np(img)
    fmt = dataformats.upper()
    if len(fmt) != a.ndim:
        raise ValueError(f"dataformats {dataformats!r} does not match an "
                         f"image of shape {a.shape}")
    if fmt == "HW":
        a = a[:, :, None]
    elif fmt == "CHW":
        a = a.transpose(1, 2, 0)
    elif fmt != "HWC":
        raise ValueError(f"dataformats must be CHW, HWC or HW, got "
                         f"{dataformats!r}")
    if a.dtype.kind == "f":
        # float images are in [0, 1], as in PyTorch
        a = (np.clip(a, 0, 1) * 255 + 0.5).astype(np.uint8)
    else:
        a = a.astype(np.uint8)
    if a.shape[2] == 2:
        raise ValueError("images need 1, 3 or 4 channels")
    return a


class SummaryWriter:
    """Writes TensorBoard event files into ``log_dir``.

    Example::

        writer = SummaryWriter()                 # runs/<date>_<host>
        for step in range(100):
            writer.add_scalar("loss/train", loss.item(), step)
        writer.close()
    """

    def __init__(self, log_dir=None, comment="", purge_step=None,
                 max_queue=10, flush_secs=120, filename_suffix=""):
        EventFileWriter, self._event_pb2, self._summary_pb2 = _tb()
        if not log_dir:
            stamp = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join(
                "runs", stamp + "_" + socket.gethostname() + comment)
        self.log_dir = str(log_dir)
        self.purge_step = purge_step
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        self.filename_suffix = filename_suffix
        self._EventFileWriter = EventFileWriter
        self._writer = EventFileWriter(self.log_dir, max_queue, flush_secs,
                                       filename_suffix)
        self._all = {self.log_dir: self._writer}
        ev = self._event_pb2.Event(wall_time=time.time(),
                                   file_version="brain.Event:2")
        if purge_step is not None:
            ev.step = int(purge_step)
            ev.session_log.status = self._event_pb2.SessionLog.START
        self._writer.add_event(ev)

    # ---------------------------------------------------------- plumbing --
    def get_logdir(self):
        return self.log_dir

    def _add(self, summary, step, walltime, writer=None):
        ev = self._event_pb2.Event(
            summary=summary,
            wall_time=time.time() if walltime is None else float(walltime))
        if step is not None:
            ev.step = int(_scalar(step))
        (writer or self._writer).add_event(ev)

    def _value(self, tag, **kw):
        S = self._summary_pb2
        return S.Summary(value=[S.Summary.Value(tag=tag, **kw)])

    # ----------------------------------------------------------- scalars --
    def add_scalar(self, tag, scalar_value, global_step=None, walltime=None,
                   new_style=False, double_precision=False):
        self._add(self._value(tag, simple_value=_scalar(scalar_value)),
                  global_step, walltime)

    def add_scalars(self, main_tag, tag_scalar_dict, global_step=None,
                    walltime=None):
        """Several curves on one chart: each goes to its own run directory
        ``log_dir/<main_tag>_<tag>``, as PyTorch does."""
        for tag, v in tag_scalar_dict.items():
            d = os.path.join(self.log_dir,
                             (main_tag + "_" + tag).replace("/", "_"))
            w = self._all.get(d)
            if w is None:
                w = self._all[d] = self._EventFileWriter(
                    d, self.max_queue, self.flush_secs, self.filename_suffix)
            self._add(self._value(main_tag, simple_value=_scalar(v)),
                      global_step, walltime, w)

    def add_histogram(self, tag, values, global_step=None, bins="tensorflow",
                      walltime=None, max_bins=None):
        a = _np(values).astype(np.float64).reshape(-1)
        if a.size == 0:
            raise ValueError("The input has no element.")
        edges = _tf_bins() if bins == "tensorflow" else bins
        counts, limits = np.histogram(a, bins=edges)
        # keep the occupied range only (with one empty bucket at each end)
        nz = np.flatnonzero(counts)
        lo, hi = max(nz[0] - 1, 0), min(nz[-1] + 2, counts.size)
        counts, limits = counts[lo:hi], limits[lo + 1:hi + 1]
        h = self._summary_pb2.HistogramProto(
            min=float(a.min()), max=float(a.max()), num=float(a.size),
            sum=float(a.sum()), sum_squares=float(a @ a),
            bucket_limit=limits.tolist(), bucket=counts.astype(float).tolist())
        self._add(self._value(tag, histo=h), global_step, walltime)

    # ------------------------------------------------------------ media ---
    def add_text(self, tag, text_string, global_step=None, walltime=None):
        S = self._summary_pb2
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2
        meta = S.SummaryMetadata(plugin_data=S.SummaryMetadata.PluginData(
            plugin_name="text"))
        t = tensor_pb2.TensorProto(
            dtype=7,    # DT_STRING
            string_val=[str(text_string).encode("utf-8")],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
        self._add(self._value(tag + "/text_summary", metadata=meta, tensor=t),
                  global_step, walltime)

    def add_image(self, tag, img_tensor, global_step=None, walltime=None,
                  dataformats="CHW"):
        a = _image_hwc(img_tensor, dataformats)
        im = self._summary_pb2.Summary.Image(
            height=a.shape[0], width=a.shape[1], colorspace=a.shape[2],
            encoded_image_string=_png(a))
        self._add(self._value(tag, image=im), global_step, walltime)

    def add_images(self, tag, img_tensor, global_step=None, walltime=None,
                   dataformats="NCHW"):
        """A batch of images, tiled into one grid (8 per row)."""
        a = _np(img_tensor)
        fmt = dataformats.upper()
        if fmt == "NHWC":
            a = a.transpose(0, 3, 1, 2)
        elif fmt != "NCHW":
            raise ValueError(f"dataformats must be NCHW or NHWC, got "
                             f"{dataformats!r}")
        n, c, h, w = a.shape
        cols = min(n, 8)
        rows = -(-n // cols)
        grid = np.zeros((c, rows * h, cols * w), a.dtype)
        for k in range(n):          # a loop over images, not elements
            r, q = divmod(k, cols)
            grid[:, r * h:(r + 1) * h, q * w:(q + 1) * w] = a[k]
        self.add_image(tag, grid, global_step, walltime, "CHW")

    def add_graph(self, model, input_to_model=None, verbose=False,
                  use_strict_trace=True):
        raise NotImplementedError(
            "SummaryWriter.add_graph needs a traced graph (TorchScript), "
            "which dtorch does not have")

    def add_hparams(self, hparam_dict, metric_dict, hparam_domain_discrete=None,
                    run_name=None, global_step=None):
        """Hyper-parameters as text and each metric as a scalar (the HParams
        plugin's own protobufs are not written)."""
        text = "\n".join(f"{k}: {v}" for k, v in hparam_dict.items())
        self.add_text("hparams", text, global_step)
        for k, v in metric_dict.items():
            self.add_scalar(k, v, global_step)

    # --------------------------------------------------------- lifecycle --
    def flush(self):
        for w in self._all.values():
            w.flush()

    def close(self):
        for w in self._all.values():
            w.flush()
            w.close()
        self._all = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
