"""``dtorch.cuda.amp``: the older spellings ``torch.cuda.amp.autocast`` and
``torch.cuda.amp.GradScaler``; ``dtorch.amp`` with device_type 'cuda'."""
from .. import amp as _amp

autocast, GradScaler = _amp._device_spellings("cuda", __name__)
