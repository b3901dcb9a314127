"""parameters_to_vector / vector_to_parameters."""
from ...tensor import Tensor
from ..._creation import cat


def _check_same_device(param, old):
    dev = param.device
    if old is not None and dev != old:
        raise TypeError("Found two parameters on different devices, this is "
                        "currently not supported.")
    return dev


def parameters_to_vector(parameters):
    """One flat tensor holding every parameter, in order."""
    device = None
    vec = []
    for p in parameters:
        device = _check_same_device(p, device)
        vec.append(p.reshape(-1))
    return cat(vec)


def vector_to_parameters(vec, parameters):
    """Copy slices of ``vec`` into the parameters' data, in order."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: "
                        f"{type(vec).__name__}")
    device = None
    pointer = 0
    for p in parameters:
        device = _check_same_device(p, device)
        n = p.numel()
        p.data = vec[pointer:pointer + n].reshape(p.shape).data
        pointer += n
