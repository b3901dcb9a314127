"""Hugging Face's sharded layout: save_torch_state_dict writes shards of a
maximum size named model-0000i-of-0000n.safetensors plus
model.safetensors.index.json (the safetensors package reads the shards);
load_torch_model loads a folder into a model, strict or not, reporting
missing/unexpected keys as load_state_dict; DCP checkpoints convert to and
from the layout."""
import json
import os

import numpy as np
import pytest
import safetensors.numpy

import dtorch
import dtorch.distributed.checkpoint as dcp
from dtorch.distributed.checkpoint.format_utils import dcp_to_hf, hf_to_dcp
from dtorch.serialization import (SerializationError, load_torch_model,
                                  save_torch_state_dict)


def _model(seed=0):
    dtorch.manual_seed(seed)
    return dtorch.nn.Sequential(dtorch.nn.Linear(8, 16),
                                dtorch.nn.BatchNorm1d(16),
                                dtorch.nn.Linear(16, 4))


def _equal(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k].numpy(), b[k].numpy()), k


def test_shards_index_and_names(tmp_path):
    sd = _model().state_dict()
    sd["half"] = dtorch.ones(3, 5, dtype=dtorch.bfloat16)
    sd["strided"] = dtorch.arange(20.0).reshape(4, 5)[:, ::2]
    save_torch_state_dict(sd, tmp_path, max_shard_size=200)   # bytes
    index = json.loads((tmp_path / "model.safetensors.index.json")
                       .read_text())
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    assert n > 2 and files == [f"model-{i:05d}-of-{n:05d}.safetensors"
                               for i in range(1, n + 1)]
    assert sorted(os.listdir(tmp_path)) == sorted(
        files + ["model.safetensors.index.json"])
    assert list(index["weight_map"]) == sorted(sd)
    total = sum(v.numel() * v.element_size() for v in sd.values())
    assert index["metadata"]["total_size"] == total
    seen = {}
    for f in files:
        part = safetensors.numpy.load_file(str(tmp_path / f))
        if len(part) > 1:           # a lone tensor may exceed the limit
            assert sum(a.nbytes for a in part.values()) <= 200
        seen.update(part)
        assert all(index["weight_map"][k] == f for k in part)
    assert sorted(seen) == sorted(sd)
    assert np.array_equal(seen["strided"], sd["strided"].numpy())
    # a later save with fewer shards leaves no stale shard behind
    save_torch_state_dict(sd, tmp_path)                       # 5GB: 1 file
    assert os.listdir(tmp_path) == ["model.safetensors"]
    _equal(dtorch.load(tmp_path / "model.safetensors"), sd)


def test_load_folder_strict_and_not(tmp_path):
    src = _model(1)
    save_torch_state_dict(src.state_dict(), tmp_path, max_shard_size="1KB")
    model = _model(2)
    res = load_torch_model(model, tmp_path, strict=True)
    assert res.missing_keys == [] and res.unexpected_keys == []
    _equal(model.state_dict(), src.state_dict())
    # a model with a different head: non-strict reports, strict raises
    other = dtorch.nn.Sequential(dtorch.nn.Linear(8, 16),
                                 dtorch.nn.BatchNorm1d(16))
    other.add_module("head", dtorch.nn.Linear(16, 4))
    res = load_torch_model(other, tmp_path)
    assert res.missing_keys == ["head.weight", "head.bias"]
    assert sorted(res.unexpected_keys) == ["2.bias", "2.weight"]
    with pytest.raises(RuntimeError, match="Missing key.*head.weight"):
        load_torch_model(other, tmp_path, strict=True)
    # PyTorch .bin shards too
    save_torch_state_dict(src.state_dict(), tmp_path / "bin",
                          max_shard_size="1KB", safe_serialization=False)
    assert (tmp_path / "bin" / "pytorch_model.bin.index.json").exists()
    model = _model(3)
    load_torch_model(model, tmp_path / "bin", strict=True)
    _equal(model.state_dict(), src.state_dict())


def test_bad_indexes_are_named(tmp_path):
    save_torch_state_dict(_model().state_dict(), tmp_path,
                          max_shard_size="1KB")
    index = tmp_path / "model.safetensors.index.json"
    body = json.loads(index.read_text())
    k = next(iter(body["weight_map"]))
    body["weight_map"][k] = "../../etc/passwd"
    index.write_text(json.dumps(body))
    with pytest.raises(SerializationError, match="outside the checkpoint"):
        load_torch_model(_model(), tmp_path)
    body["weight_map"][k] = sorted(set(body["weight_map"].values()) -
                                   {"../../etc/passwd"})[-1]
    index.write_text(json.dumps(body))
    with pytest.raises(SerializationError, match="lacks tensors"):
        load_torch_model(_model(), tmp_path)
    index.write_text("[1, 2]")
    with pytest.raises(SerializationError, match="weight_map"):
        load_torch_model(_model(), tmp_path)
    with pytest.raises(ValueError, match="max_shard_size"):
        save_torch_state_dict({}, tmp_path / "x", max_shard_size="5 parsecs")


def test_dcp_converts_to_and_from_the_layout(tmp_path):
    model, opt_step = _model(4), 3
    dcp.save({"model": model.state_dict(), "step": opt_step},
             checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    with pytest.raises(ValueError, match="prefix"):
        dcp_to_hf(str(tmp_path / "ck"), str(tmp_path / "hf"))
    dcp_to_hf(str(tmp_path / "ck"), str(tmp_path / "hf"), prefix="model.",
              max_shard_size=300)
    assert len(os.listdir(tmp_path / "hf")) > 2
    fresh = _model(5)
    load_torch_model(fresh, str(tmp_path / "hf"), strict=True)
    _equal(fresh.state_dict(), model.state_dict())
    hf_to_dcp(str(tmp_path / "hf"), str(tmp_path / "back"), prefix="model.")
    again = _model(6)
    state = {"model": again.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path / "back"), no_dist=True)
    again.load_state_dict(state["model"])
    _equal(again.state_dict(), model.state_dict())
