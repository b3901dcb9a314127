"""The data layer reads the default process group without importing
dtorch.distributed (a layer above it): DistributedSampler and the shard
datasets take rank and world size from an initialised group, and a process
that never loaded dtorch.distributed is treated as having none."""
import os
import tempfile

import numpy as np

import dtorch.distributed as dist
from dtorch.utils.data import DistributedSampler
from dtorch.utils.data.shards import ShardedIterableDataset
from helpers import run_python


def test_no_group_loads_no_distribution_code():
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from dtorch.utils.data import DistributedSampler\n"
        "from dtorch.utils.data.shards import MemmapTokenDataset\n"
        "try:\n"
        "    DistributedSampler(list(range(4)))\n"
        "except RuntimeError as e:\n"
        "    print('num_replicas and rank' in str(e))\n"
        "p = sys.argv[1]\n"
        "np.arange(20, dtype=np.uint16).tofile(p)\n"
        "ds = MemmapTokenDataset(p, block_size=4)\n"
        "print(len(ds), 'dtorch.distributed' in sys.modules,\n"
        "      'collectives' in sys.modules)\n")
    with tempfile.TemporaryDirectory() as d:
        r = run_python(code, os.path.join(d, "tok.bin"))
    # 20 tokens, windows of block_size + 1: 4 samples, ranked as rank 0 of 1
    assert r.stdout.split() == ["True", "4", "False", "False"]


def test_group_supplies_rank_and_world(tmp_path):
    path = tmp_path / "s.npy"
    np.save(path, np.arange(6))

    def fn(rank, world):
        s = DistributedSampler(list(range(7)), shuffle=False)
        ds = ShardedIterableDataset([str(path)])
        return (s.rank, s.num_replicas, list(s), ds.rank, ds.world_size)

    res = dist.spawn_threads(fn, 3, timeout=60)
    assert res == [(0, 3, [0, 3, 6], 0, 3), (1, 3, [1, 4, 0], 1, 3),
                   (2, 3, [2, 5, 1], 2, 3)]
    # outside the threads there is no group again
    assert ShardedIterableDataset([str(path)]).world_size == 1
