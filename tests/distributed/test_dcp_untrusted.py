"""dcp.load of a checkpoint whose files someone else could write: the
metadata's checksum is recomputable, so its structure is checked field by
field (an error naming the file and the field, not a KeyError or a
RecursionError), and no file outside the checkpoint directory is read
(a path in the metadata, a symlink out of the directory)."""
import json
import os
import shutil

import pytest

import dtorch
import dtorch.distributed.checkpoint as dcp
from dtorch.distributed.checkpoint import metadata as M


def _saved(tmp_path):
    path = str(tmp_path / "ck")
    dcp.save({"a": dtorch.arange(6.0).reshape(2, 3), "n": 5},
             checkpoint_id=path)
    return path


def _template():
    return {"a": dtorch.full((2, 3), -1.0), "n": -1}


def _rewrite(path, edit):
    """Change the metadata as an attacker would: edit, re-checksum."""
    meta = os.path.join(path, M.METADATA_NAME)
    with open(meta, "rb") as fh:
        doc = json.loads(fh.read())
    doc.pop("metadata_crc32")
    edit(doc)
    with open(meta, "wb") as fh:
        fh.write(M.dumps(doc))


def _fails(path, *words):
    st = _template()
    with pytest.raises(dcp.CheckpointException) as e:
        dcp.load(st, checkpoint_id=path)
    assert st["n"] == -1 and (st["a"] == -1).all().item()   # nothing loaded
    for w in words:
        assert w in str(e.value), str(e.value)
    return str(e.value)


def _entry(doc, key="a"):
    return doc["state_dict_metadata"][key]


CRAFTED = {
    # the KeyError: a tensor with neither chunks nor per_rank
    "no_chunks": (lambda d: _entry(d).pop("chunks"),
                  "state_dict_metadata['a'].per_rank"),
    "chunks_not_a_list": (lambda d: _entry(d).update(chunks={"x": 1}),
                          "state_dict_metadata['a'].chunks"),
    "offsets_rank_wrong": (
        lambda d: _entry(d)["chunks"][0].update(offsets=[0]),
        "state_dict_metadata['a'].chunks[0].offsets"),
    "box_outside": (lambda d: _entry(d)["chunks"][0].update(sizes=[2, 9]),
                    "state_dict_metadata['a'].chunks[0]"),
    "unknown_dtype": (lambda d: _entry(d).update(dtype="Q7"),
                      "state_dict_metadata['a'].dtype"),
    "unlisted_file": (lambda d: _entry(d)["chunks"][0].update(file="x"),
                      "state_dict_metadata['a'].chunks[0].file"),
    "world_size": (lambda d: d.update(world_size="2"), "world_size"),
    "files_not_dict": (lambda d: d.update(files=[]), "files"),
    "entry_type": (lambda d: _entry(d).update(type="code"),
                   "state_dict_metadata['a'].type"),
    "object_per_rank_empty": (
        lambda d: _entry(d, "n").update(value=None) or
        _entry(d, "n").pop("value") and None,
        "state_dict_metadata['n'].per_rank"),
    # the RecursionError: a value nested past the recursion limit
    "deep_value": (lambda d: _entry(d, "n").update(
        value="[" * 100000 + "]" * 100000), "'n'"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_metadata_names_the_file_and_field(tmp_path, case):
    path = _saved(tmp_path)
    edit, field = CRAFTED[case]
    _rewrite(path, edit)
    _fails(path, M.METADATA_NAME, field)


@pytest.mark.parametrize("name", ["../outside.safetensors",
                                  "ABS", "sub/../../outside.safetensors"])
def test_a_file_outside_the_directory_is_never_opened(tmp_path, name):
    path = _saved(tmp_path)
    outside = tmp_path / "outside.safetensors"
    shutil.move(os.path.join(path, "__0_0.safetensors"), outside)
    name = str(outside) if name == "ABS" else name

    def edit(doc):
        doc["files"][name] = doc["files"].pop("__0_0.safetensors")
        _entry(doc)["chunks"][0]["file"] = name
    _rewrite(path, edit)
    _fails(path, M.METADATA_NAME, "plain file name", name)


def test_a_symlink_out_of_the_directory_is_refused(tmp_path):
    path = _saved(tmp_path)
    shard = os.path.join(path, "__0_0.safetensors")
    shutil.move(shard, tmp_path / "elsewhere.safetensors")
    os.symlink(tmp_path / "elsewhere.safetensors", shard)
    _fails(path, "__0_0.safetensors", "outside the checkpoint directory")
    # a link that stays inside the directory is fine
    os.remove(shard)
    shutil.move(tmp_path / "elsewhere.safetensors",
                os.path.join(path, "real.bin"))
    os.symlink("real.bin", shard)
    st = _template()
    dcp.load(st, checkpoint_id=path)
    assert st["a"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_latest_pointer_cannot_leave_the_folder(tmp_path):
    outer = tmp_path / "outer"
    dcp.save({"a": dtorch.ones(1)}, checkpoint_id=outer)
    root = outer / "runs"
    root.mkdir()
    (root / "latest").write_text("..\n")     # names the outer checkpoint
    assert dcp.latest_checkpoint(root) is None
