"""Containers: Sequential, ModuleList, ModuleDict, ParameterList,
ParameterDict."""
from __future__ import annotations
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
import operator
from typing import Any, Union

from .module import Module
from ..parameter import Parameter

# what ModuleDict / ParameterDict accept: a mapping or (key, value) pairs
_ModulePairs = Union[Mapping[str, Module], Iterable[tuple[str, Module]]]
_ParamPairs = Union[Mapping[str, Any], Iterable[tuple[str, Any]]]


def _renumber(container):
    """Keep a container's keys 0..n-1 after a deletion, as PyTorch does."""
    items = list(container._modules.values())
    container._modules = OrderedDict((str(i), m) for i, m in enumerate(items))


def _delete(container, idx, key):
    """``del container[idx]`` for Sequential and ModuleList: the keys of a
    slice, in order, or the one ``key(idx)``; then the keys renumbered."""
    keys = (list(container._modules)[idx] if isinstance(idx, slice)
            else [key(idx)])
    for k in keys:
        delattr(container, k)
    _renumber(container)

class Sequential(Module):
    """Modules called in order, the output of each the input of the next.

    Example::

        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        model[0], model[1:], model.append(nn.Sigmoid())
    """

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)

    def _get_item_by_idx(self, iterator, idx):
        size = len(self)
        idx = operator.index(idx)
        if not -size <= idx < size:
            raise IndexError(f"index {idx} is out of range")
        idx %= size
        for i, m in enumerate(iterator):
            if i == idx:
                return m

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return type(self)(OrderedDict(list(self._modules.items())[idx]))
        return self._get_item_by_idx(self._modules.values(), idx)

    def __setitem__(self, idx: int, module: Module) -> None:
        key = self._get_item_by_idx(self._modules.keys(), idx)
        setattr(self, key, module)

    def __delitem__(self, idx: int | slice) -> None:
        _delete(self, idx,
                lambda i: self._get_item_by_idx(self._modules.keys(), i))

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __add__(self, other):
        if not isinstance(other, Sequential):
            raise ValueError(
                f"add operator supports only objects of Sequential class, "
                f"but {type(other)} is given.")
        ret = Sequential()
        for m in self:
            ret.append(m)
        for m in other:
            ret.append(m)
        return ret

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        n = len(self._modules)
        if not -n <= index <= n:
            raise IndexError(f"Index out of range: {index}")
        if index < 0:
            index += n
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules = OrderedDict((str(i), m) for i, m in enumerate(items))
        return self

    def extend(self, sequential: Iterable[Module]) -> Sequential:
        for layer in sequential:
            self.append(layer)
        return self

    def pop(self, key: int | slice) -> Any:
        v = self[key]
        del self[key]
        return v

    def forward(self, input: Any) -> Any:
        for module in self._modules.values():
            input = module(input)
        return input


class ModuleList(Module):
    """A list of modules, registered so that parameters() sees them."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _abs(self, idx):
        idx = operator.index(idx)
        if not -len(self) <= idx < len(self):
            raise IndexError(f"index {idx} is out of range")
        return idx % len(self)

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[str(self._abs(idx))]

    def __setitem__(self, idx: int, module: Module) -> None:
        setattr(self, str(self._abs(idx)), module)

    def __delitem__(self, idx: int | slice) -> None:
        _delete(self, idx, lambda i: str(self._abs(i)))

    __len__ = Sequential.__len__
    __iter__ = Sequential.__iter__

    def __iadd__(self, modules):
        return self.extend(modules)

    def __add__(self, other):
        out = ModuleList()
        for m in list(self) + list(other):
            out.append(m)
        return out

    def insert(self, index: int, module: Module) -> None:
        for i in range(len(self._modules), index, -1):
            self._modules[str(i)] = self._modules[str(i - 1)]
        self._modules[str(index)] = module

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        offset = len(self)
        for i, m in enumerate(modules):
            self.add_module(str(offset + i), m)
        return self

    def pop(self, key: int | slice) -> Module:
        v = self[key]
        del self[key]
        return v

    def __repr__(self):
        return super().__repr__()


class ModuleDict(Module):
    """An ordered dict of modules."""

    def __init__(self, modules: _ModulePairs | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def clear(self) -> None:
        self._modules.clear()

    def pop(self, key: str) -> Module:
        v = self[key]
        del self[key]
        return v

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def items(self) -> Iterable[tuple[str, Module]]:
        return self._modules.items()

    def values(self) -> Iterable[Module]:
        return self._modules.values()

    def update(self, modules: _ModulePairs) -> None:
        items = modules.items() if hasattr(modules, "items") else modules
        for k, m in items:
            self[k] = m


class ParameterList(Module):
    def __init__(self, values: Iterable[Any] | None = None) -> None:
        super().__init__()
        self._size = 0
        if values is not None:
            self.extend(values)

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return ParameterList([self[i] for i in range(len(self))[idx]])
        idx = operator.index(idx) % max(len(self), 1)
        return getattr(self, str(idx))

    def __setitem__(self, idx: int, param: Any) -> None:
        idx = operator.index(idx) % max(len(self), 1)
        if not isinstance(param, Parameter):
            param = Parameter(param)
        setattr(self, str(idx), param)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Any]:
        return iter(self[i] for i in range(len(self)))

    def append(self, value: Any) -> ParameterList:
        self._size += 1
        self[self._size - 1] = value
        return self

    def extend(self, values: Iterable[Any]) -> ParameterList:
        for v in values:
            self.append(v)
        return self

    def extra_repr(self) -> str:
        return "\n".join(f"({i}): Parameter containing: [{p.dtype} of size "
                         f"{'x'.join(map(str, p.shape))}]"
                         for i, p in enumerate(self))


class ParameterDict(Module):
    def __init__(self, parameters: _ParamPairs | None = None) -> None:
        super().__init__()
        self._keys = []
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self._keys:
            self._keys.append(key)
        if not isinstance(value, Parameter):
            value = Parameter(value)
        setattr(self, key, value)

    def __delitem__(self, key: str) -> None:
        self._keys.remove(key)
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def keys(self) -> Iterable[str]:
        return list(self._keys)

    def items(self) -> Iterable[tuple[str, Any]]:
        return [(k, self[k]) for k in self._keys]

    def values(self) -> Iterable[Any]:
        return [self[k] for k in self._keys]

    def update(self, parameters: _ParamPairs) -> None:
        items = parameters.items() if hasattr(parameters, "items") \
            else parameters
        for k, v in items:
            self[k] = v
