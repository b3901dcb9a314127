"""``nn.DataParallel``: single-process data parallelism. dtorch runs the
wrapped module on its one device (PyTorch does the same with no GPUs); the
wrapper keeps PyTorch's ``module.`` prefix in state_dict keys, so
checkpoints written by DataParallel scripts load 1:1. Multi-device data
parallelism is DistributedDataParallel's job."""
from ..._ignored import ignored_argument
from ..modules.module import Module


class DataParallel(Module):
    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super().__init__()
        self.module = module
        self.device_ids = list(device_ids) if device_ids else []
        self.output_device = output_device
        self.dim = dim
        if len(self.device_ids) > 1:
            raise NotImplementedError(
                "DataParallel over several devices is not supported by "
                "dtorch; use DistributedDataParallel (one process per "
                "device)")
        # one device: nothing is scattered or gathered
        if output_device is not None:
            ignored_argument("DataParallel", "output_device", output_device,
                             "the output stays on the module's device")
        if dim != 0:
            ignored_argument("DataParallel", "dim", dim,
                             "inputs are not scattered (one device)")

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)
