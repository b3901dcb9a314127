"""``dtorch.utils.summary``: a torchsummary-style table of a model's
layers, output shapes and parameter counts.

Forward hooks on every submodule record output shapes during one forward
pass on random input (batch of 2, so BatchNorm works in training mode).
Unlike torchsummary, a row counts all of a layer's own parameters (not only
``weight`` and ``bias``), so recurrent layers are counted right.
"""
import math

from .._backend import float32
from .._creation import rand
from ..autograd import no_grad

__all__ = ["summary"]

_WIDTH = 64


_PROBE = 2      # the batch size of the random input


def _shapes(out, batch_size):
    """Output shape(s) with the batch dimension shown as ``batch_size``.
    Only a leading dim equal to the probe batch is taken for the batch:
    an LSTM's (num_layers, batch, hidden) state keeps its first dim."""
    if isinstance(out, (list, tuple)):
        return [_shapes(o, batch_size) for o in out]
    if hasattr(out, "shape"):
        shape = list(out.shape)
        if shape and shape[0] == _PROBE:
            shape[0] = batch_size
        return shape
    return []


def _numel(shape):
    if shape and isinstance(shape[0], list):
        return sum(_numel(s) for s in shape)
    return abs(math.prod(shape)) if shape else 0


def summary(model, input_size, batch_size=-1, device="cpu", dtypes=None):
    """Print and return a table of ``model``'s layers for input of
    ``input_size`` (one shape without the batch dimension, or a list of
    shapes for several inputs).

    Example::

        dtorch.utils.summary(model, (1, 28, 28))
    """
    from ..nn import Sequential, ModuleList, ModuleDict

    if isinstance(input_size, tuple) and (
            not input_size or not isinstance(input_size[0], (tuple, list))):
        input_size = [input_size]
    input_size = [tuple(s) for s in input_size]
    if dtypes is None:
        dtypes = [float32] * len(input_size)
    rows = []
    hooks = []

    def hook(module, inputs, output):
        idx = len(rows) + 1
        params = list(module.parameters(recurse=False))
        rows.append((f"{type(module).__name__}-{idx}",
                     _shapes(output, batch_size),
                     sum(p.numel() for p in params)))

    for m in model.modules():
        if m is not model and not isinstance(
                m, (Sequential, ModuleList, ModuleDict)):
            hooks.append(m.register_forward_hook(hook))
    xs = [rand(_PROBE, *s, device=device).to(dtype=dt)
          for s, dt in zip(input_size, dtypes)]
    try:
        with no_grad():
            model(*xs)
    finally:
        for h in hooks:
            h.remove()

    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters()
                    if p.requires_grad)
    lines = ["-" * _WIDTH,
             "{:>20}  {:>25} {:>15}".format("Layer (type)", "Output Shape",
                                            "Param #"),
             "=" * _WIDTH]
    for name, shape, n in rows:
        lines.append("{:>20}  {:>25} {:>15}".format(
            name, str(shape), f"{n:,}"))
    mb = 1024 ** 2
    in_mb = abs(sum(math.prod(s) for s in input_size) * batch_size * 4 / mb)
    # outputs are kept for backward, with gradients of the same size
    out_mb = abs(2 * sum(_numel(s) for _, s, _ in rows) * 4 / mb)
    par_mb = abs(total * 4 / mb)
    lines += ["=" * _WIDTH,
              f"Total params: {total:,}",
              f"Trainable params: {trainable:,}",
              f"Non-trainable params: {total - trainable:,}",
              "-" * _WIDTH,
              f"Input size (MB): {in_mb:0.2f}",
              f"Forward/backward pass size (MB): {out_mb:0.2f}",
              f"Params size (MB): {par_mb:0.2f}",
              f"Estimated Total Size (MB): "
              f"{in_mb + out_mb + par_mb:0.2f}",
              "-" * _WIDTH]
    text = "\n".join(lines)
    print(text)
    return text
