"""DataLoader workers forked after CUDA is initialised (issue 20): they work
while they leave CUDA alone, and any CUDA use in them - a dataset returning
CUDA tensors, a worker_init_fn touching the GPU - is a clear error instead
of a hang in the driver (PyTorch's rule). Run with a GPU or
DTORCH_FAKE_CUDA=1."""
import numpy as np
import pytest

import dtorch
from dtorch.utils.data import DataLoader, Dataset, TensorDataset

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not dtorch.cuda.is_available(), reason="needs CuPy or DTORCH_FAKE_CUDA=1")]


class _CudaItems(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return dtorch.full((2,), float(i), device="cuda")


def _touch_gpu(worker_id):
    dtorch.zeros(1, device="cuda")


def test_forked_workers_serve_cpu_data_after_cuda_init():
    dtorch.zeros(1, device="cuda")          # CUDA in use in this process
    ds = TensorDataset(dtorch.arange(6.), dtorch.arange(6) * 10)
    loader = DataLoader(ds, batch_size=2, num_workers=1)
    xs = np.concatenate([b[0].numpy() for b in loader])
    assert xs.tolist() == [0., 1., 2., 3., 4., 5.]


@pytest.mark.parametrize("case", ["cuda_dataset", "cuda_in_init_fn"])
def test_cuda_use_in_a_forked_worker_is_a_clear_error(case):
    dtorch.zeros(1, device="cuda")
    if case == "cuda_dataset":
        loader = DataLoader(_CudaItems(), batch_size=2, num_workers=1)
    else:
        loader = DataLoader(TensorDataset(dtorch.arange(4.)), batch_size=2,
                            num_workers=1, worker_init_fn=_touch_gpu)
    with pytest.raises(Exception, match="DataLoader worker process cannot "
                                        "use CUDA"):
        list(loader)
