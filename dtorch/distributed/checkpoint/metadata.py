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
    from ...serialization import SerializationError
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SerializationError(
            f"{where} is corrupt: not a JSON checkpoint metadata file "
            "(truncated or overwritten?)") from None
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
    for key in ("state_dict_metadata", "files", "world_size"):
        if key not in doc:
            raise SerializationError(f"{where} is corrupt: no {key!r}")
    sdm = {}
    for k, e in doc["state_dict_metadata"].items():
        if e.get("type") == "tensor":
            chunks = [ChunkStorageMetadata(c["offsets"], c["sizes"])
                      for c in e.get("chunks", [])]
            sdm[k] = TensorStorageMetadata(e["dtype"], e["size"], chunks)
        else:
            sdm[k] = BytesStorageMetadata()
    return Metadata(sdm, doc["world_size"], doc.get("step"), doc)
