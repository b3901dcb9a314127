"""Moving a stage's tensors to its neighbour: a small header, then the data.

The receiving stage does not know what the sender's submodule returns
(shape, dtype, how many tensors), so every activation message is preceded
by a fixed-size int64 header describing it. Gradients need no header: they
have the shape of the activation they belong to, which the receiver of the
gradient sent itself.

Sends are always nonblocking (``isend``) and waited for later: two
neighbours sending to each other at the same moment (an activation one way,
a gradient the other, as 1F1B does) would deadlock on backends whose
blocking send waits for the matching receive (MPI's rendezvous protocol
for large messages).
"""
import dtorch

from ... import distributed as dist

# the dtypes that can cross a stage boundary, by their code in the header
_DTYPES = [dtorch.float32, dtorch.float64, dtorch.float16, dtorch.bfloat16,
           dtorch.int64, dtorch.int32, dtorch.int16, dtorch.int8,
           dtorch.uint8, dtorch.bool]
_CODE = {d: i for i, d in enumerate(_DTYPES)}
_MAX_TENSORS, _MAX_DIMS = 5, 8
_PER = 3 + _MAX_DIMS                       # dtype, requires_grad, ndim, dims
HEADER_LEN = 1 + _MAX_TENSORS * _PER

# tags keep the kinds of message, and the stages a rank runs, apart on
# backends that match by tag (nccl matches by order only)
META, ACT, GRAD, TIED = 1, 2, 3, 4


def tag(kind, to_stage):
    """The tag of a ``kind`` message for stage ``to_stage``."""
    return 16 + 8 * int(to_stage) + kind


def encode_header(tensors, where, device):
    if len(tensors) > _MAX_TENSORS:
        raise ValueError(f"{where}: a stage passes at most {_MAX_TENSORS} "
                         f"tensors to the next one, got {len(tensors)}")
    h = [0] * HEADER_LEN
    h[0] = len(tensors)
    for i, t in enumerate(tensors):
        if not isinstance(t, dtorch.Tensor):
            raise TypeError(f"{where}: output {i} is a "
                            f"{type(t).__name__}; a stage passes tensors "
                            f"(or a tuple of tensors) to the next stage")
        if t.dim() > _MAX_DIMS or t.dtype not in _CODE:
            raise ValueError(f"{where}: output {i} ({list(t.shape)}, "
                             f"{t.dtype}) cannot cross a stage boundary "
                             f"(at most {_MAX_DIMS} dims, dtypes "
                             f"{[str(d) for d in _DTYPES]})")
        o = 1 + i * _PER
        h[o:o + 3] = [_CODE[t.dtype], int(t.requires_grad), t.dim()]
        h[o + 3:o + 3 + t.dim()] = list(t.shape)
    # on the stage's device like the data: nccl moves device buffers only
    return dtorch.tensor(h, dtype=dtorch.int64, device=device)


def decode_header(h):
    """[(shape, dtype, requires_grad)] from a received header."""
    v = h.tolist()
    out = []
    for i in range(int(v[0])):
        o = 1 + i * _PER
        code, rg, nd = v[o:o + 3]
        out.append((tuple(v[o + 3:o + 3 + nd]), _DTYPES[code], bool(rg)))
    return out


class Sender:
    """Nonblocking sends whose buffers stay referenced until they are
    done; finished ones are dropped as we go, so a sent activation is not
    kept alive longer than the transfer needs."""

    def __init__(self):
        self._pending = []           # (work, tensor)

    def send(self, t, dst, group, tag):
        t = t.detach().contiguous()
        w = dist.isend(t, dst, group=group, tag=tag)
        if w is not None:
            self._pending.append((w, t))
        self.reap()

    def reap(self):
        self._pending = [(w, t) for w, t in self._pending
                         if not w.is_completed()]

    def wait_all(self):
        pending, self._pending = self._pending, []
        for w, _ in pending:
            w.wait()


def recv(shape, dtype, device, src, group, tag):
    t = dtorch.empty(shape, dtype=dtype, device=device)
    dist.recv(t, src, group=group, tag=tag)
    return t
