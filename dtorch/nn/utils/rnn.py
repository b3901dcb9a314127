"""``nn.utils.rnn``: padding and packing variable-length sequences, with
PyTorch's ``PackedSequence`` layout (time-major rows, ``batch_sizes`` per
step, sorted by decreasing length; ``sorted_indices`` /
``unsorted_indices`` when the batch was reordered).

``RNN``/``LSTM``/``GRU`` accept a PackedSequence: ``packed_forward`` runs
the sequences of each distinct length as one dense batch (a loop over
lengths, not over time steps or elements), so every sequence sees exactly
its own steps in both directions and ``h_n`` is taken at its last step.
"""
from collections import namedtuple

import numpy as np

from ... import _backend as B
from ...tensor import Tensor
from ..._creation import cat, stack, tensor as _tensor

__all__ = ["PackedSequence", "pack_padded_sequence", "pad_packed_sequence",
           "pad_sequence", "pack_sequence", "unpack_sequence",
           "unpad_sequence", "invert_permutation"]


class PackedSequence(namedtuple("PackedSequence", [
        "data", "batch_sizes", "sorted_indices", "unsorted_indices"])):
    """Rows of a batch of sequences, time step by time step."""

    def __new__(cls, data, batch_sizes=None, sorted_indices=None,
                unsorted_indices=None):
        if unsorted_indices is None and sorted_indices is not None:
            unsorted_indices = invert_permutation(sorted_indices)
        return super().__new__(cls, data, batch_sizes, sorted_indices,
                               unsorted_indices)

    def to(self, *args, **kwargs):
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self
        dev = data.device

        def move(t):
            return None if t is None else t.to(dev)
        return type(self)(data, self.batch_sizes, move(self.sorted_indices),
                          move(self.unsorted_indices))

    def cpu(self):
        return self.to("cpu")

    def cuda(self, *args, **kwargs):
        # Tensor.cuda's arguments (device index, ...) pick the device
        return self.to(self.data.new_empty(0).cuda(*args, **kwargs).device)

    def double(self):
        return self.to(dtype=B.float64)

    def float(self):
        return self.to(dtype=B.float32)

    @property
    def is_cuda(self):
        return self.data.is_cuda

    def is_pinned(self):
        return False


def invert_permutation(permutation):
    if permutation is None:
        return None
    xp = permutation._xp()
    out = xp.empty_like(permutation._data)
    out[permutation._data] = xp.arange(permutation._data.size)
    return Tensor._wrap(out)


def _lengths_array(lengths):
    if isinstance(lengths, Tensor):
        return np.asarray(lengths.detach().cpu()._data, np.int64)
    return np.asarray(lengths, np.int64)


def _valid_positions(batch_sizes, n):
    """Flat row indices (t * n + b) of the valid steps, time-major."""
    bs = np.asarray(batch_sizes, np.int64)
    mask = np.arange(n)[None, :] < bs[:, None]
    return np.flatnonzero(mask.reshape(-1))


def _pack_sorted(padded, batch_sizes):
    """Rows of a time-major padded batch already in sorted order."""
    T, n = padded.shape[:2]
    pos = _valid_positions(batch_sizes, n)
    flat = padded.reshape((T * n,) + tuple(padded.shape[2:]))
    return flat.index_select(0, Tensor._wrap(padded.device.send(pos)
                                             if padded.device.type != "cpu"
                                             else pos))


def pack_padded_sequence(input, lengths, batch_first=False,
                         enforce_sorted=True):
    """Pack a padded batch (T, B, *) (or (B, T, *)) of sequences with the
    given lengths."""
    lens = _lengths_array(lengths)
    if lens.ndim != 1 or lens.size != input.shape[0 if batch_first else 1]:
        raise RuntimeError(
            f"Expected `len(lengths)` to be equal to batch_size, but got "
            f"{lens.size} (batch_size={input.shape[0 if batch_first else 1]})")
    if (lens <= 0).any():
        raise RuntimeError("Length of all samples has to be greater than 0, "
                           "but found an element in 'lengths' that is <= 0")
    if enforce_sorted:
        if (np.diff(lens) > 0).any():
            raise RuntimeError(
                "`lengths` array must be sorted in decreasing order when "
                "`enforce_sorted` is True. You can pass "
                "`enforce_sorted=False` to pack_padded_sequence and/or "
                "pack_sequence to sidestep this requirement if you do not "
                "need ONNX exportability.")
        sorted_indices = None
    else:
        order = np.argsort(-lens, kind="stable")
        lens = lens[order]
        sorted_indices = _tensor(order, dtype=B.int64)
        if input.device.type != "cpu":
            sorted_indices = sorted_indices.to(input.device)
        input = input.index_select(0 if batch_first else 1, sorted_indices)
    if batch_first:
        input = input.transpose(0, 1)
    T = int(lens[0])
    if T > input.shape[0]:
        raise RuntimeError(f"lengths exceed the padded length {input.shape[0]}")
    batch_sizes = (lens[None, :] > np.arange(T)[:, None]).sum(1)
    data = _pack_sorted(input[:T], batch_sizes)
    return PackedSequence(data, _tensor(batch_sizes, dtype=B.int64),
                          sorted_indices, None)


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0,
                        total_length=None):
    """Inverse of pack_padded_sequence: (padded batch, lengths), in the
    batch's original order."""
    data, bs = sequence.data, _lengths_array(sequence.batch_sizes)
    T, n = len(bs), int(bs[0])
    if total_length is not None:
        if total_length < T:
            raise ValueError(
                f"Expected total_length to be at least the length of the "
                f"longest sequence in input, but got total_length="
                f"{total_length} and max sequence length being {T}")
    else:
        total_length = T
    pos = _valid_positions(bs, n)
    rest = tuple(data.shape[1:])
    full = data.new_full((total_length * n,) + rest, padding_value)
    idx = Tensor._wrap(data.device.send(pos) if data.device.type != "cpu"
                       else pos)
    padded = full.index_copy(0, idx, data).reshape((total_length, n) + rest)
    lengths = (bs[None, :] > np.arange(n)[:, None]).sum(1)
    if sequence.unsorted_indices is not None:
        padded = padded.index_select(1, sequence.unsorted_indices)
        lengths = lengths[_lengths_array(sequence.unsorted_indices)]
    if batch_first:
        padded = padded.transpose(0, 1)
    return padded, _tensor(lengths, dtype=B.int64)


def pad_sequence(sequences, batch_first=False, padding_value=0.0,
                 padding_side="right"):
    """Stack sequences of shapes (L_i, *) into (max L, B, *) (or (B, max
    L, *)), padding with ``padding_value``."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right,"
                         f" but got {padding_side}.")
    seqs = list(sequences)
    if not seqs:
        raise RuntimeError("received an empty list of sequences")
    L = max(s.shape[0] for s in seqs)
    rows = []
    for s in seqs:            # one cat per sequence
        k = L - s.shape[0]
        if k:
            fill = s.new_full((k,) + tuple(s.shape[1:]), padding_value)
            s = cat([s, fill] if padding_side == "right" else [fill, s], 0)
        rows.append(s)
    return stack(rows, 0 if batch_first else 1)


def pack_sequence(sequences, enforce_sorted=True):
    lengths = [s.shape[0] for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths,
                                enforce_sorted=enforce_sorted)


def unpad_sequence(padded_sequences, lengths, batch_first=False):
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    return [x[i, :int(n)] for i, n in enumerate(_lengths_array(lengths))]


def unpack_sequence(packed_sequences):
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)


def packed_forward(rnn, packed, hx):
    """RNN/LSTM/GRU over a PackedSequence (see the module docstring).
    ``hx`` and the returned hidden state are in the batch's original order;
    the output is packed like the input."""
    lstm = rnn.mode == "LSTM"
    padded, lengths = pad_packed_sequence(packed)     # (T, B, *), original
    lens = _lengths_array(lengths)
    T = padded.shape[0]
    dev = padded.device

    def idx_t(a):
        t = Tensor._wrap(np.asarray(a, np.int64))
        return t.to(dev) if dev.type != "cpu" else t

    outs, hs, cs, order = [], [], [], []
    for L in sorted(set(lens.tolist()), reverse=True):
        ids = np.flatnonzero(lens == L)
        sel = idx_t(ids)
        x = padded[:L].index_select(1, sel)
        h = None
        if hx is not None:
            h = tuple(t.index_select(1, sel) for t in hx) if lstm \
                else hx.index_select(1, sel)
        if rnn.batch_first:
            x = x.transpose(0, 1)
        y, hn = rnn.forward(x, h)
        if rnn.batch_first:
            y = y.transpose(0, 1)
        if L < T:             # zeros after the sequence ends
            y = cat([y, y.new_zeros((T - L,) + tuple(y.shape[1:]))], 0)
        outs.append(y)
        hs.append(hn[0] if lstm else hn)
        if lstm:
            cs.append(hn[1])
        order.extend(ids.tolist())
    # groups back into the batch's original order
    back = idx_t(np.argsort(np.asarray(order), kind="stable"))
    out = cat(outs, 1).index_select(1, back)
    h_n = cat(hs, 1).index_select(1, back)
    # repack in the input's sorted order
    if packed.sorted_indices is not None:
        out = out.index_select(1, packed.sorted_indices)
    data = _pack_sorted(out, _lengths_array(packed.batch_sizes))
    res = PackedSequence(data, packed.batch_sizes, packed.sorted_indices,
                         packed.unsorted_indices)
    if lstm:
        return res, (h_n, cat(cs, 1).index_select(1, back))
    return res, h_n
