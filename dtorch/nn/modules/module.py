"""``Module``: the base class of layers and models, with PyTorch's semantics
(registration by attribute assignment, dotted ``state_dict`` keys, hooks,
``repr``) at the size of PyTorch's early ``module.py``."""
from __future__ import annotations
from collections import OrderedDict, namedtuple
from collections.abc import Callable, Iterator, Mapping
import itertools
import warnings
from typing import Any, TypeVar

from ... import _backend as B
from ...tensor import Tensor
from ..._creation import empty_like
from ...autograd.grad_mode import no_grad
from ..parameter import Parameter, Buffer

_M = TypeVar("_M", bound="Module")    # methods that return self


class _IncompatibleKeys(namedtuple("IncompatibleKeys",
                                   ["missing_keys", "unexpected_keys"])):
    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class RemovableHandle:
    """Returned by ``register_*_hook``; ``remove()`` unregisters."""
    _ids = itertools.count()

    def __init__(self, hooks_dict: dict[int, Any]) -> None:
        self.hooks_dict = hooks_dict
        self.id = next(RemovableHandle._ids)

    def remove(self) -> None:
        self.hooks_dict.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


_global_forward_pre_hooks = OrderedDict()
_global_forward_hooks = OrderedDict()


def register_module_forward_pre_hook(hook):
    """``hook(module, args)`` before every module's forward (PyTorch's
    global hook; runs before the module's own pre-hooks)."""
    h = RemovableHandle(_global_forward_pre_hooks)
    _global_forward_pre_hooks[h.id] = (hook, False)
    return h


def register_module_forward_hook(hook, *, with_kwargs=False):
    """``hook(module, args, output)`` (``hook(module, args, kwargs,
    output)`` with ``with_kwargs=True``) after every module's forward."""
    h = RemovableHandle(_global_forward_hooks)
    _global_forward_hooks[h.id] = (hook, with_kwargs)
    return h


def _addindent(s, n):
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    first = lines.pop(0)
    return first + "\n" + "\n".join(" " * n + line for line in lines)


def zero_grads(params, set_to_none=True):
    """Drop (``set_to_none``) or zero the gradients of ``params``; shared by
    ``Module.zero_grad`` and ``Optimizer.zero_grad``."""
    for p in params:
        g = p.grad
        if g is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            if g.grad_fn is not None:
                g.detach_()
            else:
                g.requires_grad_(False)
            g.zero_()


class Module:
    """Base class for all neural network modules.

    Example::

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(10, 1)

            def forward(self, x):
                return self.fc(x)
    """
    training: bool
    _version = 1
    call_super_init = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            raise TypeError(
                f"{type(self).__name__}.__init__() got an unexpected "
                f"argument: Module.__init__ takes no arguments")
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = OrderedDict()
        d["_buffers"] = OrderedDict()
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = OrderedDict()
        d["_forward_pre_hooks"] = OrderedDict()
        d["_forward_hooks"] = OrderedDict()
        d["_forward_hooks_with_kwargs"] = set()
        d["_state_dict_hooks"] = OrderedDict()
        d["_load_state_dict_pre_hooks"] = OrderedDict()

    def forward(self, *input: Any) -> Any:
        raise NotImplementedError(
            f'Module [{type(self).__name__}] is missing the required '
            f'"forward" function')

    # ------------------------------------------------------ registration --
    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                "cannot assign parameter before Module.__init__() call")
        self._check_name(name, "parameter", self._parameters)
        if param is None:
            self._parameters[name] = None
            return
        if not isinstance(param, Parameter):
            raise TypeError(
                f"cannot assign '{type(param).__name__}' object to parameter "
                f"'{name}' (torch.nn.Parameter or None required)")
        if param.grad_fn is not None:
            raise ValueError(
                f"Cannot assign non-leaf Tensor to parameter '{name}'. Model "
                f"parameters must be created explicitly. To express '{name}' "
                f"as a function of another Tensor, compute the value in the "
                f"forward() method.")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None,
                        persistent: bool = True) -> None:
        if "_buffers" not in self.__dict__:
            raise AttributeError(
                "cannot assign buffer before Module.__init__() call")
        self._check_name(name, "buffer", self._buffers)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{type(tensor).__name__}' object to buffer "
                f"'{name}' (torch Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_module(self, name: str, module: Module | None) -> None:
        self.add_module(name, module)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module "
                            f"subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got "
                            f"{type(name).__name__}")
        if "." in name:
            raise KeyError(f'module name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError('module name can\'t be empty string ""')
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._modules[name] = module

    def _check_name(self, name, what, table):
        if not isinstance(name, str):
            raise TypeError(f"{what} name should be a string. Got "
                            f"{type(name).__name__}")
        if "." in name:
            raise KeyError(f'{what} name can\'t contain "."')
        if name == "":
            raise KeyError(f'{what} name can\'t be empty string ""')
        if hasattr(self, name) and name not in table:
            raise KeyError(f"attribute '{name}' already exists")

    def __setattr__(self, name, value):
        d = self.__dict__
        params = d.get("_parameters")

        def remove_from(*dicts):
            for dd in dicts:
                if name in dd:
                    if isinstance(dd, set):
                        dd.discard(name)
                    else:
                        del dd[name]

        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError(
                    "cannot assign parameters before Module.__init__() call")
            remove_from(d, self._buffers, self._modules,
                        self._non_persistent_buffers_set)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as parameter "
                    f"'{name}' (torch.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            mods = d.get("_modules")
            if mods is None:
                raise AttributeError(
                    "cannot assign module before Module.__init__() call")
            remove_from(d, self._parameters, self._buffers,
                        self._non_persistent_buffers_set)
            mods[name] = value
        elif d.get("_modules") is not None and name in d["_modules"]:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as child module "
                    f"'{name}' (torch.nn.Module or None expected)")
            d["_modules"][name] = value
        elif isinstance(value, Buffer):
            remove_from(d, self._parameters, self._modules)
            self.register_buffer(name, value, value.persistent)
        elif d.get("_buffers") is not None and name in d["_buffers"]:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as buffer "
                    f"'{name}' (torch.Tensor or None expected)")
            d["_buffers"][name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            t = d.get(table)
            if t is not None and name in t:
                return t[name]
        raise AttributeError(f"'{type(self).__name__}' object has no "
                             f"attribute '{name}'")

    def __delattr__(self, name):
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._buffers:
            del self._buffers[name]
            self._non_persistent_buffers_set.discard(name)
        elif name in self._modules:
            del self._modules[name]
        else:
            object.__delattr__(self, name)

    def __dir__(self):
        keys = list(object.__dir__(self)) + list(self._parameters) + \
            list(self._modules) + list(self._buffers)
        return sorted(k for k in set(keys) if not k[0].isdigit())

    def __setstate__(self, state):
        self.__dict__.update(state)

    # ---------------------------------------------------------- iteration --
    def _named_members(self, get_members, prefix="", recurse=True,
                       remove_duplicate=True):
        memo = set()
        mods = self.named_modules(prefix=prefix,
                                  remove_duplicate=remove_duplicate) \
            if recurse else [(prefix, self)]
        for mod_prefix, mod in mods:
            for k, v in get_members(mod):
                if v is None or (remove_duplicate and id(v) in memo):
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield (mod_prefix + ("." if mod_prefix else "") + k, v)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_parameters(
            self, prefix: str = "", recurse: bool = True,
            remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        yield from self._named_members(
            lambda m: m._parameters.items(), prefix, recurse,
            remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def named_buffers(
            self, prefix: str = "", recurse: bool = True,
            remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        yield from self._named_members(
            lambda m: m._buffers.items(), prefix, recurse, remove_duplicate)

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        memo = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in memo:
                memo.add(id(m))
                yield name, m

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_modules(
            self, memo: set[int] | None = None, prefix: str = "",
            remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from m.named_modules(memo, sub, remove_duplicate)

    def get_submodule(self, target: str) -> Module:
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(f"{type(mod).__name__} has no attribute "
                                     f"`{item}`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return mod

    def get_parameter(self, target: str) -> Parameter:
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._parameters:
            raise AttributeError(f"{type(mod).__name__} has no parameter "
                                 f"`{name}`")
        return mod._parameters[name]

    def get_buffer(self, target: str) -> Tensor:
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._buffers:
            raise AttributeError(f"{type(mod).__name__} has no buffer "
                                 f"`{name}`")
        return mod._buffers[name]

    # ------------------------------------------------------------- modes --
    def train(self: _M, mode: bool = True) -> _M:
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self: _M) -> _M:
        return self.train(False)

    def requires_grad_(self: _M, requires_grad: bool = True) -> _M:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grads(self.parameters(), set_to_none)

    def apply(self: _M, fn: Callable[[Module], None]) -> _M:
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ---------------------------------------------------- device / dtype --
    def _apply(self, fn, recurse=True):
        """Replace every parameter's and buffer's data by fn(data), keeping
        the Parameter objects (so optimizers keep their references)."""
        if recurse:
            for m in self.children():
                m._apply(fn)
        with no_grad():
            for key, p in self._parameters.items():
                if p is None:
                    continue
                new = fn(p)
                if new._data is not p._data:
                    p._data = new._data
                    p._bump_version()
                if p.grad is not None:
                    g = fn(p.grad)
                    p._grad = g if g is not p.grad else p.grad
            for key, b in self._buffers.items():
                if b is not None:
                    self._buffers[key] = fn(b)
        return self

    def to(self: _M, *args: Any, **kwargs: Any) -> _M:
        """to(device), to(dtype) (floating point tensors only), to(tensor),
        to(device, dtype)."""
        dev = kwargs.get("device")
        dt = kwargs.get("dtype")
        for a in args:
            if isinstance(a, Tensor):
                dev, dt = a.device, a.dtype
            elif isinstance(a, B.dtype):
                dt = a
            elif a is not None:
                dev = a
        if dt is not None:
            dt = B.to_dtype(dt)
            if not dt.is_floating_point:
                raise TypeError(
                    f"nn.Module.to only accepts floating point or complex "
                    f"dtypes, but got desired dtype={dt}")

        def convert(t):
            return t.to(device=dev,
                        dtype=dt if t.is_floating_point() else None)
        return self._apply(convert)

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``torch.nn.Module.compile``: this module's calls run compiled
        from now on, in place (``dtorch.compile``'s arguments)."""
        from ..._compile import compile_in_place
        compile_in_place(self, *args, **kwargs)

    def to_empty(self: _M, *, device: Any, recurse: bool = True) -> _M:
        """Parameters and buffers as new uninitialised tensors of the same
        shapes and dtypes on ``device`` (PyTorch's: a model built on the
        meta device gets storage; ``reset_parameters()`` then initialises
        it)."""
        return self._apply(lambda t: empty_like(t, device=device),
                           recurse=recurse)

    def cuda(self: _M, device: int | B.device | None = None) -> _M:
        if isinstance(device, int):
            device = B.device("cuda", device)
        return self._apply(lambda t: t.to(device or "cuda"))

    def cpu(self: _M) -> _M:
        return self._apply(lambda t: t.to("cpu"))

    def type(self: _M, dst_type: B.dtype | str) -> _M:
        return self._apply(lambda t: t.to(dst_type))

    def _float_cast(self, dt):
        return self._apply(
            lambda t: t.to(dt) if t.is_floating_point() else t)

    def float(self: _M) -> _M:
        return self._float_cast(B.float32)

    def double(self: _M) -> _M:
        return self._float_cast(B.float64)

    def half(self: _M) -> _M:
        return self._float_cast(B.float16)

    def bfloat16(self: _M) -> _M:
        return self._float_cast(B.bfloat16)

    # ------------------------------------------------------------- hooks --
    def register_forward_pre_hook(
            self, hook: Callable[..., Any], *, prepend: bool = False,
            with_kwargs: bool = False) -> RemovableHandle:
        """``hook(module, args)`` runs before forward; a returned value
        (a tuple, or one value) replaces the positional args."""
        h = RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[h.id] = (hook, with_kwargs)
        if prepend:
            self._forward_pre_hooks.move_to_end(h.id, last=False)
        return h

    def register_forward_hook(self, hook: Callable[..., Any], *,
                              prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        """``hook(module, args, output)`` runs after forward; a returned
        value replaces the output. ``always_call=True``: it also runs (with
        output None) when forward or an earlier hook raises, before the
        error propagates."""
        h = RemovableHandle(self._forward_hooks)
        self._forward_hooks[h.id] = (hook, with_kwargs)
        if always_call:
            self.__dict__.setdefault("_forward_hooks_always_called",
                                     set()).add(h.id)
        if prepend:
            self._forward_hooks.move_to_end(h.id, last=False)
        return h

    def register_full_backward_hook(self, hook: Callable[..., Any],
                                    prepend: bool = False) -> RemovableHandle:
        raise NotImplementedError(
            "dtorch does not support module backward hooks; use "
            "Tensor.register_hook on the output instead")

    register_backward_hook = register_full_backward_hook

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if B._cupy is not None and args and isinstance(args[0], Tensor):
            # functional code in forward may call CuPy directly: run it on
            # the input's device (CuPy's kernels go to the current one)
            with B.device_guard(args[0]._data):
                return self._call_with_hooks(args, kwargs)
        if not (self._forward_pre_hooks or self._forward_hooks
                or _global_forward_pre_hooks or _global_forward_hooks):
            return self.forward(*args, **kwargs)
        return self._call_with_hooks(args, kwargs)

    def _call_with_hooks(self, args, kwargs):
        if not (self._forward_pre_hooks or self._forward_hooks
                or _global_forward_pre_hooks or _global_forward_hooks):
            return self.forward(*args, **kwargs)
        for hook, with_kw in itertools.chain(
                _global_forward_pre_hooks.values(),
                self._forward_pre_hooks.values()):
            if with_kw:
                res = hook(self, args, kwargs)
                if res is not None:
                    args, kwargs = res
                continue
            res = hook(self, args)
            if res is not None:
                args = res if isinstance(res, tuple) else (res,)
        called = set()
        out = None
        try:
            out = self.forward(*args, **kwargs)
            for key, (hook, with_kw) in itertools.chain(
                    _global_forward_hooks.items(),
                    self._forward_hooks.items()):
                called.add(key)
                res = hook(self, args, kwargs, out) if with_kw else \
                    hook(self, args, out)
                if res is not None:
                    out = res
        except Exception:
            self._run_always_called_hooks(args, kwargs, out, called)
            raise
        return out

    def _run_always_called_hooks(self, args, kwargs, out, called):
        """PyTorch's always_call forward hooks after a failure: each one not
        run yet runs; its own error is a warning, the first error wins."""
        always = self.__dict__.get("_forward_hooks_always_called", ())
        for key, (hook, with_kw) in list(self._forward_hooks.items()):
            if key not in always or key in called:
                continue
            try:
                res = hook(self, args, kwargs, out) if with_kw else \
                    hook(self, args, out)
                if res is not None:
                    out = res
            except Exception as e:
                warnings.warn(
                    "module forward hook with ``always_call=True`` raised an "
                    "exception that was silenced as another error was raised "
                    f"in forward: {e}", stacklevel=3)

    _call_impl = __call__

    # -------------------------------------------------------- state dict --
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()
        extra = getattr(type(self), "get_extra_state", None)
        if extra is not None and extra is not Module.get_extra_state:
            destination[prefix + "_extra_state"] = self.get_extra_state()

    def get_extra_state(self) -> Any:
        raise RuntimeError(
            "Reached a code path in Module.get_extra_state() that should "
            "never be called.")

    def set_extra_state(self, state: Any) -> None:
        raise RuntimeError(
            "Reached a code path in Module.set_extra_state() that should "
            "never be called.")

    def state_dict(self, *args: Any, destination: dict[str, Any] | None = None,
                   prefix: str = "",
                   keep_vars: bool = False) -> dict[str, Any]:
        """Parameters and persistent buffers by dotted name."""
        if args:   # the old positional form: (destination, prefix, keep)
            destination = args[0]
            if len(args) > 1:
                prefix = args[1]
            if len(args) > 2:
                keep_vars = args[2]
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination,
                             prefix=prefix + name + ".", keep_vars=keep_vars)
        for hook in self._state_dict_hooks.values():
            res = hook(self, destination, prefix, {})
            if res is not None:
                destination = res
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata,
                              strict, missing_keys, unexpected_keys,
                              error_msgs):
        for hook in self._load_state_dict_pre_hooks.values():
            hook(state_dict, prefix, local_metadata, strict, missing_keys,
                 unexpected_keys, error_msgs)
        persistent = {k: v for k, v in self._buffers.items()
                      if k not in self._non_persistent_buffers_set}
        local = {k: v for k, v in itertools.chain(
            self._parameters.items(), persistent.items()) if v is not None}
        for name, param in local.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            val = state_dict[key]
            if not isinstance(val, Tensor):
                try:
                    from ..._creation import as_tensor
                    val = as_tensor(val)
                except Exception:
                    error_msgs.append(
                        f'While copying the parameter named "{key}", '
                        f"expected torch.Tensor or Tensor-like object from "
                        f"checkpoint but received {type(val)}")
                    continue
            if tuple(val.shape) != tuple(param.shape):
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape "
                    f"{val.shape} from checkpoint, the shape in current "
                    f"model is {param.shape}.")
                continue
            if local_metadata.get("assign_to_params_buffers", False):
                # assign=True: the checkpoint's tensor becomes the parameter
                # (its dtype and device kept), with the old requires_grad
                if isinstance(param, Parameter):
                    rg = param.requires_grad
                    val = val.requires_grad_(rg) if isinstance(
                        val, Parameter) else Parameter(val, requires_grad=rg)
                setattr(self, name, val)
                continue
            try:
                with no_grad():
                    param.copy_(val)
            except Exception as ex:
                error_msgs.append(
                    f'While copying the parameter named "{key}", whose '
                    f"dimensions in the model are {param.shape} and whose "
                    f"dimensions in the checkpoint are {val.shape}, an "
                    f"exception occurred : {ex.args}.")
        extra_key = prefix + "_extra_state"
        has_extra = getattr(type(self), "set_extra_state", None) is not \
            Module.set_extra_state
        if has_extra:
            if extra_key in state_dict:
                self.set_extra_state(state_dict[extra_key])
            elif strict:
                missing_keys.append(extra_key)
        if strict:
            for key in state_dict:
                if not key.startswith(prefix) or key == extra_key:
                    continue
                rest = key[len(prefix):]
                name = rest.split(".", 1)[0]
                if name not in self._modules and name not in local:
                    unexpected_keys.append(key)

    def load_state_dict(self, state_dict: Mapping[str, Any],
                        strict: bool = True,
                        assign: bool = False) -> _IncompatibleKeys:
        """Copy parameters and buffers from ``state_dict``; returns
        ``(missing_keys, unexpected_keys)``; with ``strict`` any mismatch
        raises RuntimeError listing them, as in PyTorch. ``assign=True``
        puts the state dict's tensors in place of the module's (keeping
        each parameter's requires_grad) instead of copying into them."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"Expected state_dict to be dict-like, got "
                            f"{type(state_dict)}.")
        missing, unexpected, errors = [], [], []

        def load(module, prefix=""):
            module._load_from_state_dict(
                state_dict, prefix, {"assign_to_params_buffers": assign},
                True, missing, unexpected, errors)
            for name, child in module._modules.items():
                if child is not None:
                    load(child, prefix + name + ".")
        load(self)
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. "
                              .format(", ".join(f'"{k}"'
                                                for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. "
                              .format(", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError(
                "Error(s) in loading state_dict for {}:\n\t{}".format(
                    type(self).__name__, "\n\t".join(errors)))
        return _IncompatibleKeys(missing, unexpected)

    def register_state_dict_pre_hook(
            self, hook: Callable[..., Any]) -> RemovableHandle:
        raise NotImplementedError("state_dict pre hooks are not supported")

    def _register_state_dict_hook(self, hook):
        h = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[h.id] = hook
        return h

    def _register_load_state_dict_pre_hook(self, hook, with_module=False):
        h = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[h.id] = hook
        return h

    # ----------------------------------------------------------- printing --
    def extra_repr(self) -> str:
        return ""

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        lines = []
        extra = self.extra_repr()
        if extra:
            lines = extra.split("\n")
        for key, m in self._modules.items():
            mod_str = _addindent(repr(m), 2)
            lines.append("(" + key + "): " + mod_str)
        main = self._get_name() + "("
        if lines:
            if len(lines) == 1 and not self._modules:
                main += lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"
