"""What a checkpoint's ``.metadata`` file holds (PyTorch's names:
``Metadata``, ``TensorStorageMetadata``, ``ChunkStorageMetadata``,
``BytesStorageMetadata``), stored as JSON so that loading runs no code.

One entry per flattened state_dict key (``model.fc.weight``,
``optim.state.fc.weight.exp_avg``, ``step``):

- a tensor: its dtype (safetensors code), global ``size`` and ``chunks``,
  each a box (``offsets``, ``sizes``) of the global tensor stored as the
  safetensors tensor ``name`` in ``file``. Chunks tile the tensor, no
  overlap. A tensor whose value differed between ranks (a per-rank
  tensor) has ``per_rank`` chunks instead, by saving rank.
- an object (any non-tensor value): its JSON ``value`` (dtorch.save's
  structure encoding), or ``per_rank`` values where ranks differed.

Also: ``world_size``, ``layout`` (each sharded key and how it was cut),
``step``, and per file its size and the CRC-32 of its safetensors header
(which holds each tensor's checksum, so the pair vouches for the whole
file), and a CRC-32 of the metadata itself.
"""
import dataclasses
import json
import zlib

FORMAT = "dtorch.dcp/1"
METADATA_NAME = ".metadata"


@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: list
    sizes: list


@dataclasses.dataclass
class TensorStorageMetadata:
    dtype: str
    size: list
    chunks: list


@dataclasses.dataclass
class BytesStorageMetadata:
    pass


@dataclasses.dataclass
class Metadata:
    """The parsed ``.metadata`` file: ``state_dict_metadata`` maps each key
    to a TensorStorageMetadata or BytesStorageMetadata; ``raw`` is the
    JSON document (files, layout, per-rank entries)."""
    state_dict_metadata: dict
    world_size: int
    step: object
    raw: dict


def _crc(doc):
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return "%08x" % zlib.crc32(body.encode())


def dumps(doc):
    """The file's bytes: the document plus a CRC-32 of it."""
    doc = dict(doc)
    doc.pop("metadata_crc32", None)
    doc["metadata_crc32"] = _crc(doc)
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def loads(raw, where):
    """Parse and check a ``.metadata`` file's bytes; errors name ``where``."""
    from ...serialization import SerializationError, json_document
    doc = json_document(raw, f"{where} is corrupt: not a JSON checkpoint "
                             "metadata file (truncated or overwritten?)")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SerializationError(
            f"{where} is not a dtorch distributed checkpoint metadata file "
            f"(format {doc.get('format') if isinstance(doc, dict) else None!r}"
            f", expected {FORMAT!r})")
    want = doc.pop("metadata_crc32", None)
    if want != _crc(doc):
        raise SerializationError(
            f"{where} is corrupt: its checksum does not match (stored "
            f"{want!r}, computed {_crc(doc)!r})")
    _check(doc, where, SerializationError)
    sdm = {}
    for k, e in doc["state_dict_metadata"].items():
        if e.get("type") == "tensor":
            chunks = [ChunkStorageMetadata(c["offsets"], c["sizes"])
                      for c in e.get("chunks", [])]
            sdm[k] = TensorStorageMetadata(e["dtype"], e["size"], chunks)
        else:
            sdm[k] = BytesStorageMetadata()
    return Metadata(sdm, doc["world_size"], doc.get("step"), doc)


def plain_name(name):
    """True for a file name that stays in its directory: no separator, not
    '.' or '..', no NUL (metadata and ``latest`` name files this way)."""
    return isinstance(name, str) and name not in ("", ".", "..") and not \
        any(c in name for c in ("/", "\\", "\0"))


def _check(doc, where, error):
    """The structure loading relies on, field by field: a crafted or
    damaged file raises ``error`` naming ``where`` and the field instead
    of a KeyError deep in the loader."""
    from ...serialization import _DTYPES

    def bad(field, want, got):
        text = repr(got)
        raise error(f"{where} is corrupt: {field} must be {want}, got "
                    f"{text[:200] + '...' if len(text) > 200 else text}")

    def typed(v, t, field, want):
        if not isinstance(v, t) or isinstance(v, bool):
            bad(field, want, v)
        return v

    def ints(v, field, n=None):
        typed(v, list, field, "a list of integers >= 0")
        if any(not isinstance(i, int) or isinstance(i, bool) or i < 0
               for i in v):
            bad(field, "a list of integers >= 0", v)
        if n is not None and len(v) != n:
            bad(field, f"{n} integers (the tensor's dimensions)", v)
        return v

    def rank(v, field):
        if typed(v, int, field, "a rank (an integer >= 0)") < 0:
            bad(field, "a rank (an integer >= 0)", v)

    def per_rank(e, field):
        pr = typed(e.get("per_rank"), dict, field + ".per_rank",
                   "a dict rank -> entry (the entry has no value/chunks)")
        if not pr:
            bad(field + ".per_rank", "a dict with a rank", pr)
        for r in pr:
            if not r.isdigit():
                bad(f"{field}.per_rank key", "a rank", r)
        return pr

    def chunks(cs, size, field):
        for i, c in enumerate(typed(cs, list, field, "a list of chunks")):
            f = f"{field}[{i}]"
            typed(c, dict, f, "a dict")
            off = ints(c.get("offsets"), f + ".offsets", len(size))
            sz = ints(c.get("sizes"), f + ".sizes", len(size))
            if any(o + n > g for o, n, g in zip(off, sz, size)):
                bad(f, f"a box inside the tensor's size {size}",
                    {"offsets": off, "sizes": sz})
            rank(c.get("rank"), f + ".rank")
            if "file" in c and c["file"] not in files:
                bad(f + ".file", "a file listed under 'files'", c["file"])
            if "name" in c:
                typed(c["name"], str, f + ".name", "a tensor name")

    typed(doc.get("world_size"), int, "world_size", "an integer >= 1")
    if doc["world_size"] < 1:
        bad("world_size", "an integer >= 1", doc["world_size"])
    files = typed(doc.get("files"), dict, "files", "a dict")
    for name, info in files.items():
        if not plain_name(name):
            bad("a name in files", "a plain file name inside the "
                "checkpoint directory (no path)", name)
        f = f"files[{name!r}]"
        typed(info, dict, f, "a dict")
        typed(info.get("size"), int, f + ".size", "an integer >= 0")
        rank(info.get("rank"), f + ".rank")
    sdm = typed(doc.get("state_dict_metadata"), dict, "state_dict_metadata",
                "a dict")
    for k, e in sdm.items():
        f = f"state_dict_metadata[{k!r}]"
        typed(e, dict, f, "a dict")
        if e.get("type") == "tensor":
            if e.get("dtype") not in _DTYPES:
                bad(f + ".dtype", f"one of {sorted(_DTYPES)}", e.get("dtype"))
            size = ints(e.get("size"), f + ".size")
            if "flat_of" in e:
                ints(e["flat_of"], f + ".flat_of")
            if "chunks" in e:
                chunks(e["chunks"], size, f + ".chunks")
            else:
                for r, cs in per_rank(e, f).items():
                    chunks(cs, size, f"{f}.per_rank[{r!r}]")
        elif e.get("type") == "object":
            if "value" in e:
                typed(e["value"], str, f + ".value", "a JSON text")
            else:
                for r, v in per_rank(e, f).items():
                    typed(v, str, f"{f}.per_rank[{r!r}]", "a JSON text")
        else:
            bad(f + ".type", "'tensor' or 'object'", e.get("type"))
