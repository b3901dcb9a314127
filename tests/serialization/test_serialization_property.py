"""Property test: dtorch.save then dtorch.load gives back a bitwise-equal
object, for thousands of random nested objects of the kinds checkpoints
hold (state dicts, optimizer states with nested dicts/lists/numbers/
strings/None) with tensors of every dtype and shape, 0-size and 0-d
included, and any key names (unicode, dots, slashes); the safetensors
package's parser reads every file, each tensor under the name the
documented rule gives it.

About 1 file in 32 has a header length whose low byte is 0x80 (a pickle's
first byte) or whose low half is 0x4B50 ("PK"); each example saves a batch
of objects so that the test covers thousands of files in a few seconds.
"""
import collections
import io
import math
import struct

import numpy as np
import safetensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dtorch

DTYPES = [dtorch.float32, dtorch.float64, dtorch.float16, dtorch.bfloat16,
          dtorch.int64, dtorch.int32, dtorch.int16, dtorch.int8,
          dtorch.uint8, dtorch.bool]
FLOATS = {dtorch.float32, dtorch.float64, dtorch.float16, dtorch.bfloat16}

BATCH = 25          # objects per example
EXAMPLES = 80       # 2,000 objects in all


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    n = math.prod(shape) * dtype.itemsize
    # random bytes: every bit pattern (NaN payloads, -0.0, subnormals)
    raw = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    if dtype is dtorch.bool:
        raw = raw & 1
    t = dtorch.from_numpy(raw.view(dtype.np).reshape(shape))
    if dtype in FLOATS and draw(st.booleans()):
        t.requires_grad_(True)
    return t


# any code point, lone surrogates too (valid Python str keys)
names = st.text(st.characters(exclude_categories=())
                | st.sampled_from("./_"), max_size=12)
scalars = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
           | st.floats(allow_nan=True, allow_infinity=True) | names)
keys = names | st.integers(-5, 10 ** 6) | st.none() | st.booleans()
values = st.recursive(
    scalars | tensors(),
    lambda inner: (st.lists(inner, max_size=4)
                   | st.lists(inner, max_size=3).map(tuple)
                   | st.dictionaries(keys, inner, max_size=4)
                   | st.dictionaries(names, inner, max_size=3).map(
                       collections.OrderedDict)),
    max_leaves=12)

state_dicts = st.dictionaries(names, tensors(), max_size=6)
optimizer_states = st.fixed_dictionaries({
    "state": st.dictionaries(st.integers(0, 50), st.dictionaries(
        st.sampled_from(["step", "exp_avg", "exp_avg_sq", "momentum_buffer"]),
        tensors() | st.none(), max_size=3), max_size=4),
    "param_groups": st.lists(st.dictionaries(
        names, scalars | st.lists(st.integers(0, 50), max_size=4),
        max_size=5), max_size=2)})
checkpoints = (st.dictionaries(names, values, max_size=5) | state_dicts
               | st.fixed_dictionaries({"model": state_dicts,
                                        "optimizer": optimizer_states,
                                        "epoch": st.integers(0, 100)}))


def _bits(a):
    a = a.detach().numpy()
    return a.dtype, a.shape, a.tobytes()


def same(a, b):
    """Bitwise equality of what was saved and what came back."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, dtorch.Tensor):
        assert (a.dtype, a.requires_grad) == (b.dtype, b.requires_grad)
        assert _bits(a) == _bits(b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for (ka, va), (kb, vb) in zip(a.items(), b.items()):
            same(ka, kb)
            same(va, vb)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, float):
        # JSON keeps -0.0 and the value; a NaN's sign/payload is not kept
        assert (math.isnan(a) and math.isnan(b)) or \
            struct.pack("<d", a) == struct.pack("<d", b)
    else:
        assert a == b


def expected_names(obj):
    """{tensor name: tensor}, from the rule in dtorch.serialization's
    docstring: the dotted path of keys/indices; a shared tensor under its
    first path; an empty, reserved, non-UTF-8 or taken name suffixed with
    the first free #N."""
    out, seen = {}, set()

    def walk(o, parts):
        if isinstance(o, dtorch.Tensor):
            if id(o) in seen:
                return
            seen.add(id(o))
            name = ".".join(parts)
            try:
                name.encode("utf-8")
                plain = name not in ("", "__metadata__", *out)
            except UnicodeEncodeError:
                name = name.encode("utf-8", "backslashreplace").decode()
                plain = False
            i = 1
            while not plain and f"{name}#{i}" in out:
                i += 1
            out[name if plain else f"{name}#{i}"] = o
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(v, parts + [k if isinstance(k, str) else repr(k)])
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, parts + [str(i)])
    walk(obj, [])
    return out


def readable_by_safetensors(obj, data):
    """The safetensors package's own parser reads the file: every tensor
    by its expected name, with its bytes."""
    got = dict(safetensors.deserialize(bytes(data)))
    want = expected_names(obj)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        a = t.detach().numpy()
        assert got[name]["shape"] == list(a.shape)
        assert bytes(got[name]["data"]) == a.tobytes()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(st.lists(checkpoints, min_size=BATCH, max_size=BATCH), st.data())
def test_save_load_round_trip_is_bitwise(tmp_path_factory, objs, data):
    for obj in objs:
        buf = io.BytesIO()
        dtorch.save(obj, buf)
        same(obj, dtorch.load(io.BytesIO(buf.getvalue())))
        readable_by_safetensors(obj, buf.getvalue())
    # one per batch through a real file, read and memory-mapped
    path = tmp_path_factory.mktemp("prop") / "ckpt.pt"
    obj = data.draw(st.sampled_from(objs))
    dtorch.save(obj, path)
    same(obj, dtorch.load(path))
    same(obj, dtorch.load(path, mmap=True))
    path.unlink()
