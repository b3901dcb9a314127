"""Offline conversion between a distributed checkpoint and one
``dtorch.save`` file, as ``torch.distributed.checkpoint.format_utils``, or
a Hugging Face sharded folder (``model-0000i-of-0000n.safetensors`` +
``model.safetensors.index.json``): no process group, any number of saving
ranks; every tensor comes out whole (its chunks assembled), per-rank
values as the lowest saving rank's.

    dcp_to_torch_save("runs/ddp_digits", "ddp_digits.safetensors")
    torch_save_to_dcp("model.safetensors", "runs/from_file")
    dcp_to_hf("runs/llm", "hf_out/", prefix="model.")
    hf_to_dcp("hf_out/", "runs/from_hf", prefix="model.")
"""
import numpy as np

from ... import serialization as S
from ...serialization import _sharded
from ...tensor import Tensor
from ._files import _read_metadata, latest_checkpoint
from ._flatten import _decode_object
from ._load import _assemble, _Reader
from ._save import save

__all__ = ["dcp_to_torch_save", "torch_save_to_dcp", "dcp_to_hf",
           "hf_to_dcp"]


def _full_state(dcp_checkpoint_dir):
    """{dotted key: whole tensor or value} of a checkpoint, and its path."""
    path = latest_checkpoint(dcp_checkpoint_dir) or \
        str(dcp_checkpoint_dir)
    meta = _read_metadata(path)
    reader = _Reader(path, meta)
    out = {}
    for key, e in meta.raw["state_dict_metadata"].items():
        if e["type"] != "tensor":
            text = e["value"] if "value" in e else \
                e["per_rank"][min(e["per_rank"], key=int)]
            out[key] = _decode_object(text, f"{path} ({key!r})")
            continue
        whole = Tensor._wrap(np.empty(e["size"], S._DTYPES[e["dtype"]]))
        out[key] = Tensor._wrap(np.array(
            _assemble(key, e, whole, 0, reader, []), copy=True))
    return out, path


def _nest(flat):
    """Dotted keys back to nested dicts where that is unambiguous at the
    first level (``model.fc.weight`` -> ``{"model": {"fc.weight": ..}}``);
    the checkpoint does not record deeper nesting."""
    out = {}
    for k, v in flat.items():
        top, dot, rest = k.partition(".")
        if dot and (top not in out or isinstance(out[top], dict)):
            out.setdefault(top, {})[rest] = v
        else:
            out[k] = v
    return out


def dcp_to_torch_save(dcp_checkpoint_dir, torch_save_path):
    """Write the whole checkpoint as one ``dtorch.save`` file: a dict of
    the top-level keys, each a dict by the rest of the dotted key
    (``{"model": {"fc.weight": tensor}, "step": 5}``)."""
    flat, _ = _full_state(dcp_checkpoint_dir)
    S.save(_nest(flat), torch_save_path)


def torch_save_to_dcp(torch_save_path, dcp_checkpoint_dir):
    """Write a ``dtorch.save`` file (a dict) as a one-rank distributed
    checkpoint, which then loads on any number of ranks."""
    obj = S.load(torch_save_path)
    if not isinstance(obj, dict):
        raise TypeError(f"{torch_save_path} holds a "
                        f"{type(obj).__name__}, not a dict")
    save(obj, checkpoint_id=dcp_checkpoint_dir, no_dist=True)


def dcp_to_hf(dcp_checkpoint_dir, save_directory, *, prefix="",
              max_shard_size="5GB", filename_pattern=None):
    """Write the checkpoint's tensors whose key starts with ``prefix``
    (stripped: ``prefix="model."`` keeps ``model.fc.weight`` as
    ``fc.weight``) as a Hugging Face sharded folder. A non-tensor value
    under the prefix is an error (the layout holds tensors only)."""
    flat, path = _full_state(dcp_checkpoint_dir)
    sd, other = {}, []
    for k, v in flat.items():
        if not k.startswith(prefix):
            continue
        if isinstance(v, Tensor):
            sd[k[len(prefix):]] = v
        else:
            other.append(k)
    if other or not sd:
        raise ValueError(
            f"dcp_to_hf: {path} has " + (
                f"non-tensor values {other[:5]} under prefix {prefix!r}"
                if other else f"no tensor under prefix {prefix!r}")
            + "; choose the model's tensors with prefix= (keys: "
            f"{sorted(flat)[:5]}...)")
    _sharded.save_torch_state_dict(sd, save_directory,
                                   max_shard_size=max_shard_size,
                                   filename_pattern=filename_pattern)


def hf_to_dcp(hf_dir, dcp_checkpoint_dir, *, prefix=""):
    """Write a Hugging Face folder (sharded or one file) as a one-rank
    distributed checkpoint, each key behind ``prefix`` (``"model."``:
    it then loads into ``{"model": model.state_dict()}`` on any number
    of ranks)."""
    sd = _sharded.read_folder(hf_dir, mmap=True)
    if prefix:
        top, dot, rest = prefix.partition(".")
        if not dot or rest:
            raise ValueError(f"hf_to_dcp: prefix must be one key and a dot "
                             f"('model.'), not {prefix!r}")
        sd = {top: sd}
    save(sd, checkpoint_id=dcp_checkpoint_dir, no_dist=True)
