"""Auto-wrap policies (PyTorch's ``torch.distributed.fsdp.wrap`` names):
``policy(module=m, recurse=bool, nonwrapped_numel=int) -> bool``; with
``recurse=True`` it answers whether to look inside ``m``, with False whether
to make ``m`` an FSDP unit of its own."""
__all__ = ["ModuleWrapPolicy", "size_based_auto_wrap_policy",
           "always_wrap_policy"]


class ModuleWrapPolicy:
    """Wrap every submodule that is an instance of one of
    ``module_classes``."""

    def __init__(self, module_classes):
        self._classes = tuple(module_classes)

    def __call__(self, module, recurse, nonwrapped_numel=0):
        return True if recurse else isinstance(module, self._classes)


def size_based_auto_wrap_policy(module, recurse, nonwrapped_numel,
                                min_num_params=int(1e8),
                                force_leaf_modules=None,
                                exclude_wrap_modules=None):
    """Wrap a submodule once it holds at least ``min_num_params`` elements
    not already wrapped (use ``functools.partial`` to set the size)."""
    if recurse:
        return True
    return nonwrapped_numel >= min_num_params


def always_wrap_policy(module, recurse, nonwrapped_numel=0):
    return True

