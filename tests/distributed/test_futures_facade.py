"""dtorch.futures.Future (torch.futures.Future's semantics) and the public
facade pieces nn.parallel uses: group.WORLD, get_global_rank,
get_group_rank, get_process_group_ranks, all_to_all_single."""
import threading

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch.futures import Future, collect_all, wait_all


def test_future_set_result_wait_value_then():
    f = Future()
    assert not f.done()
    with pytest.raises(RuntimeError, match="before the future completed"):
        f.value()
    chained = f.then(lambda fut: fut.value() * 2)   # callback gets the future
    f.set_result(21)
    assert f.done() and f.wait() == 21 and f.value() == 21
    assert chained.wait() == 42
    assert f.then(lambda fut: fut.value() + 1).wait() == 22   # after done
    with pytest.raises(RuntimeError, match="already completed"):
        f.set_result(0)


def test_future_exceptions_propagate_through_then():
    f = Future()
    g = f.then(lambda fut: fut.value())
    f.set_exception(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        f.wait()
    with pytest.raises(ValueError, match="boom"):
        g.wait()
    h = Future()
    bad = h.then(lambda fut: 1 / 0)
    h.set_result(1)
    with pytest.raises(ZeroDivisionError):
        bad.wait()
    with pytest.raises(TypeError, match="expects an exception"):
        Future().set_exception("not an exception")


def test_future_wait_blocks_until_another_thread_completes_it():
    f = Future()
    t = threading.Thread(target=lambda: f.set_result("x"))
    t.start()
    assert f.wait() == "x"
    t.join()


def test_collect_all_and_wait_all():
    fs = [Future() for _ in range(3)]
    allf = collect_all(fs)
    for i, f in enumerate(fs):
        assert not allf.done()
        f.set_result(i)
    assert allf.wait() is not None and wait_all(fs) == [0, 1, 2]
    assert collect_all([]).wait() == []


def test_group_world_is_the_calling_threads_default():
    assert dist.group.WORLD is None and dist.GroupMember.WORLD is None

    def body(rank, n):
        g = dist.group.WORLD
        return (g is dist.GroupMember.WORLD, dist.get_rank(g),
                dist.get_process_group_ranks(g))
    assert dist.spawn_threads(body, 2) == [(True, 0, [0, 1]),
                                           (True, 1, [0, 1])]
    assert dist.group.WORLD is None


def test_global_and_group_ranks_of_a_subgroup():
    def body(rank, n):
        sub = dist.new_group([1, 2])
        if sub is dist.GroupMember.NON_GROUP_MEMBER:
            return None
        with pytest.raises(ValueError, match="out of range"):
            dist.get_global_rank(sub, 2)
        with pytest.raises(ValueError, match="not a member"):
            dist.get_group_rank(sub, 0)
        return (dist.get_process_group_ranks(sub),
                dist.get_global_rank(sub, 1), dist.get_group_rank(sub, 2))
    res = dist.spawn_threads(body, 3)
    assert res == [None, ([1, 2], 2, 1), ([1, 2], 2, 1)]


def test_all_to_all_single_equal_splits():
    def body(rank, n):
        inp = dtorch.tensor(np.arange(n * 2, dtype=np.float64) + 10 * rank)
        out = dtorch.zeros(n * 2, dtype=dtorch.float64)
        v = out._version
        dist.all_to_all_single(out, inp)
        assert out._version == v + 1
        with pytest.raises(ValueError, match="divisible by the group size"):
            dist.all_to_all_single(dtorch.zeros(3), dtorch.zeros(3))
        with pytest.raises(NotImplementedError, match="uneven splits"):
            dist.all_to_all_single(out, inp, [1, 3], [1, 3])
        return out.tolist()
    res = dist.spawn_threads(body, 2)
    # rank r receives block r of every rank's input
    assert res[0] == [0.0, 1.0, 10.0, 11.0]
    assert res[1] == [2.0, 3.0, 12.0, 13.0]
