"""The errors of dtorch.save / dtorch.load, shared by every format."""
import json
import pickle


class SerializationError(RuntimeError):
    """A file that ``dtorch.load`` cannot read, or an object that
    ``dtorch.save`` cannot write."""


class ChecksumError(SerializationError):
    """A file whose bytes disagree with the checksums stored in it."""


class NotPlainError(SerializationError):
    """An object that the safetensors layout cannot hold (a Module, a
    user class): ``dtorch.save`` writes PyTorch's pickle format instead,
    and raises this only where that was ruled out."""


class WeightsOnlyError(SerializationError, pickle.UnpicklingError):
    """``weights_only=True`` refused something in the file; a
    ``pickle.UnpicklingError``, as PyTorch raises."""


def json_document(raw, corrupt):
    """UTF-8 JSON bytes as their document, or SerializationError(corrupt)
    for bytes that are not (a file cut short, overwritten or foreign)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SerializationError(corrupt) from None
