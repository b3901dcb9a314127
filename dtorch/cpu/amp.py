"""``dtorch.cpu.amp``: the older spellings ``torch.cpu.amp.autocast`` and
``GradScaler`` that scripts still use; the same objects as ``dtorch.amp``
with device_type 'cpu'."""
from .. import amp as _amp

autocast, GradScaler = _amp._device_spellings("cpu", __name__)
