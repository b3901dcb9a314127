"""The ``weights_only=True`` unpickler: a pickle interpreter that calls
nothing outside an allow-list, and the user's additions to that list
(``add_safe_globals`` and friends, PyTorch's API).

``pickle.Unpickler`` is not used: it would resolve and call whatever the
file names. Here a GLOBAL is looked up through ``resolve(module, name)``
(the caller's table: PyTorch's allow-list mapped to dtorch, plus the
user's globals), and only an object that came out of ``resolve`` can be
called (REDUCE), instantiated (NEWOBJ) or given state (BUILD). The
interpreter is iterative; every length read from the stream is checked
against the bytes left before anything is allocated, and the finished
object is checked for nesting deeper than ``MAX_DEPTH`` (deeper objects
break ``repr``, ``==``, ``copy.deepcopy`` and pickling later).
"""
import _compat_pickle
import codecs
import collections
import pickle
import struct

from ._errors import WeightsOnlyError

MAX_DEPTH = 1000
# Each opcode builds at most one object, of ~64 bytes if small (a list, a
# tuple, a float; strings and bytes are the file's own bytes): a pickle may
# run at most budget(file size) opcodes, so the objects it builds take at
# most max(16 x the file, 64 MiB). torch.save writes ~31 opcodes per
# tensor (a ResNet-18 state dict: 3,756 opcodes, ~0.24 MB of objects, in a
# 47 MB file); a list of floats needs ~7x its pickle; a file of empty
# containers needs 32-64x and stops.
_OBJECT = 64


def budget(size):
    """The opcodes a pickle in a ``size``-byte file may run."""
    return max(16 * size, 64 << 20) // _OBJECT


# --------------------------------------------------- user safe globals --
# A list, not a set: kept in the order given, each entry once.
_user = []


def add_safe_globals(safe_globals):
    """Allow these globals (classes, functions, or ``(obj, "module.name")``
    pairs) in ``dtorch.load(weights_only=True)``, as
    ``torch.serialization.add_safe_globals``.

    Example::

        dtorch.serialization.add_safe_globals([MyConfig])
    """
    for g in safe_globals:
        if g not in _user:
            _user.append(g)


def get_safe_globals():
    """The globals that ``add_safe_globals`` allowed."""
    return list(_user)


def clear_safe_globals():
    """Forget every global that ``add_safe_globals`` allowed."""
    del _user[:]


class safe_globals:
    """``with dtorch.serialization.safe_globals([Net, nn.Conv2d]):``
    allows these globals inside the block only."""

    def __init__(self, safe_globals):
        self.safe_globals = list(safe_globals)
        self._added = []

    def __enter__(self):
        self._added = [g for g in self.safe_globals if g not in _user]
        add_safe_globals(self._added)

    def __exit__(self, *exc):
        for g in self._added:
            if g in _user:
                _user.remove(g)
        return False


def user_globals():
    """{"module.qualname": object} of the user's safe globals."""
    out = {}
    for g in _user:
        if isinstance(g, tuple):
            if len(g) != 2:
                raise ValueError(
                    "Expected tuple of length 2 (global, str of callable "
                    f"full path), but got tuple of length: {len(g)}")
            if type(g[1]) is not str:
                raise TypeError(
                    "Expected second item in tuple to be str of callable "
                    f"full path, but got: {type(g[1])}")
            out[g[1]] = g[0]
        else:
            out[f"{g.__module__}.{g.__qualname__}"] = g
    return out


# -------------------------------------------------------- error texts --

_UNSAFE = (
    "PyTorch 2.6 changed the default of `weights_only` in `torch.load` from "
    "`False` to `True`, and dtorch.load follows. Re-running `dtorch.load` "
    "with `weights_only` set to `False` will likely succeed, but it can "
    "result in arbitrary code execution. Do it only if you got the file "
    "from a trusted source.")


def unsupported_global(where, full):
    """PyTorch's message for a global that is not on the list."""
    if full.startswith("builtins."):
        full = full[len("builtins."):]
    return WeightsOnlyError(
        f"Weights only load failed for {where}. This file can still be "
        "loaded, to do so you have two options, do those steps only if you "
        f"trust the source of the checkpoint.\n\t(1) {_UNSAFE}\n\t(2) "
        "Alternatively, to load with `weights_only=True` please check the "
        "recommended steps in the following error message.\n\t"
        f"WeightsUnpickler error: Unsupported global: GLOBAL {full} was not "
        "an allowed global by default. Please use "
        f"`dtorch.serialization.add_safe_globals([{full}])` or the "
        f"`dtorch.serialization.safe_globals([{full}])` context manager to "
        "allowlist this global if you trust this class/function.")


def refused(where, why, hint=True):
    """Any other refusal: the file and the reason (and, where the file is
    well formed, that weights_only=False would load it)."""
    return WeightsOnlyError(f"Weights only load failed for {where}: {why}."
                            + (f" {_UNSAFE}" if hint else ""))


# ------------------------------------------------------- the machine --

_MARK = object()           # the stack's mark (pickle's MARK opcode)
# protocol-0 text opcodes and buffers: torch.save never writes them
_REFUSED = {pickle.INT, pickle.LONG, pickle.STRING, pickle.UNICODE,
            pickle.FLOAT, pickle.GET, pickle.PUT, pickle.PERSID,
            pickle.INST, pickle.OBJ, pickle.EXT1, pickle.EXT2, pickle.EXT4,
            b"\x97", b"\x98"}            # NEXT_BUFFER, READONLY_BUFFER
_NAMES = {pickle.__dict__[n][0]: n for n in dir(pickle)
          if n.isupper() and isinstance(pickle.__dict__[n], bytes)
          and len(pickle.__dict__[n]) == 1}


class _Truncated(Exception):
    pass


class Unpickler:
    """``Unpickler(buf, where, resolve, persistent_load).load(pos)`` ->
    (object, end): run the pickle that starts at ``buf[pos]``.

    ``resolve(module, name)`` returns an allowed object or raises;
    ``persistent_load(pid)`` builds what a persistent id names.
    ``encoding`` decodes Python 2 strings ("bytes" keeps them bytes)."""

    def __init__(self, buf, where, resolve, persistent_load,
                 encoding="utf-8", max_ops=None):
        self.buf, self.where = memoryview(buf), where
        self.resolve, self.persistent_load = resolve, persistent_load
        self.encoding = encoding
        self.max_ops = budget(len(self.buf)) if max_ops is None else max_ops
        self.allowed = {}        # id -> object that came out of resolve

    # reading ------------------------------------------------------------
    def take(self, n):
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise _Truncated(f"needs {n} bytes at byte {self.pos}, "
                             f"{len(self.buf) - self.pos} are left")
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def line(self):
        end = bytes(self.buf[self.pos:self.pos + 4096]).find(b"\n")
        if end < 0:
            raise _Truncated(f"no end of line at byte {self.pos}")
        return bytes(self.take(end + 1)[:-1]).decode("utf-8")

    def sized(self, fmt):
        n, = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
        return self.take(n)

    def text(self, fmt):
        return str(self.sized(fmt), "utf-8", "surrogatepass")

    # the allow-list ----------------------------------------------------
    def global_(self, module, name):
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        obj = self.resolve(module, name)
        self.allowed[id(obj)] = obj
        return obj

    def callable_(self, f, what):
        if self.allowed.get(id(f)) is not f:
            raise refused(self.where, f"it asks to {what} {_short(f)}, "
                          "which is not an allowed global")
        return f

    def load(self, pos=0):
        self.pos = pos
        try:
            return self._run(), self.pos
        except _Truncated as e:
            raise refused(self.where, f"the pickle is truncated ({e})",
                          False) from None
        except (IndexError, KeyError, TypeError, ValueError,
                AttributeError, struct.error, UnicodeDecodeError,
                OverflowError, MemoryError) as e:
            if isinstance(e, WeightsOnlyError):
                raise
            raise refused(self.where, "malformed pickle "
                          f"({type(e).__name__}: {e})", False) from None

    def _run(self):
        stack, marks, memo = [], [], {}
        push, take = stack.append, self.take
        ops = 0

        def pop_mark():
            nonlocal stack, push
            items = stack
            stack = marks.pop()
            push = stack.append
            return items

        while True:
            op = bytes(take(1))
            ops += 1
            if ops > self.max_ops:
                raise refused(self.where, f"its pickle runs more than "
                              f"{self.max_ops} opcodes, whose objects could "
                              f"take more than {self.max_ops * _OBJECT} bytes"
                              " of memory (an object bomb?)", False)
            if op == pickle.BINPUT:
                memo[take(1)[0]] = stack[-1]
            elif op == pickle.BINGET:
                push(memo[take(1)[0]])
            elif op == pickle.LONG_BINPUT:
                memo[struct.unpack("<I", take(4))[0]] = stack[-1]
            elif op == pickle.LONG_BINGET:
                push(memo[struct.unpack("<I", take(4))[0]])
            elif op == pickle.MEMOIZE:
                memo[len(memo)] = stack[-1]
            elif op == pickle.MARK:
                marks.append(stack)
                stack = []
                push = stack.append
            elif op == pickle.BININT1:
                push(take(1)[0])
            elif op == pickle.BININT2:
                push(struct.unpack("<H", take(2))[0])
            elif op == pickle.BININT:
                push(struct.unpack("<i", take(4))[0])
            elif op == pickle.LONG1:
                push(pickle.decode_long(bytes(self.sized("<B"))))
            elif op == pickle.LONG4:
                push(pickle.decode_long(bytes(self.sized("<i"))))
            elif op == pickle.BINFLOAT:
                push(struct.unpack(">d", take(8))[0])
            elif op == pickle.BINUNICODE:
                push(self.text("<I"))
            elif op == pickle.SHORT_BINUNICODE:
                push(self.text("<B"))
            elif op == pickle.BINUNICODE8:
                push(self.text("<Q"))
            elif op in (pickle.BINBYTES, pickle.SHORT_BINBYTES,
                        pickle.BINBYTES8):
                fmt = {pickle.BINBYTES: "<I", pickle.SHORT_BINBYTES: "<B",
                       pickle.BINBYTES8: "<Q"}[op]
                push(bytes(self.sized(fmt)))
            elif op == pickle.BYTEARRAY8:
                push(bytearray(self.sized("<Q")))
            elif op in (pickle.SHORT_BINSTRING, pickle.BINSTRING):
                raw = bytes(self.sized("<B" if op == pickle.SHORT_BINSTRING
                                       else "<i"))
                push(raw if self.encoding == "bytes"
                     else raw.decode(self.encoding))
            elif op == pickle.NONE:
                push(None)
            elif op == pickle.NEWTRUE:
                push(True)
            elif op == pickle.NEWFALSE:
                push(False)
            elif op == pickle.EMPTY_TUPLE:
                push(())
            elif op == pickle.TUPLE1:
                stack[-1] = (stack[-1],)
            elif op == pickle.TUPLE2:
                stack[-2:] = [tuple(stack[-2:])]
            elif op == pickle.TUPLE3:
                stack[-3:] = [tuple(stack[-3:])]
            elif op == pickle.TUPLE:
                items = pop_mark()
                push(tuple(items))
            elif op == pickle.EMPTY_LIST:
                push([])
            elif op == pickle.LIST:
                items = pop_mark()
                push(items)
            elif op == pickle.EMPTY_DICT:
                push({})
            elif op == pickle.DICT:
                items = pop_mark()
                push(dict(zip(items[::2], items[1::2])))
            elif op == pickle.EMPTY_SET:
                push(set())
            elif op == pickle.FROZENSET:
                items = pop_mark()
                push(frozenset(items))
            elif op == pickle.APPEND:
                item = stack.pop()
                self._target(stack[-1], list, "APPEND").append(item)
            elif op == pickle.APPENDS:
                items = pop_mark()
                self._target(stack[-1], list, "APPENDS").extend(items)
            elif op == pickle.SETITEM:
                v, k = stack.pop(), stack.pop()
                self._target(stack[-1], dict, "SETITEM")[k] = v
            elif op == pickle.SETITEMS:
                items = pop_mark()
                d = self._target(stack[-1], dict, "SETITEMS")
                for i in range(0, len(items) - 1, 2):
                    d[items[i]] = items[i + 1]
            elif op == pickle.ADDITEMS:
                items = pop_mark()
                self._target(stack[-1], set, "ADDITEMS").update(items)
            elif op == pickle.POP:
                if stack:
                    stack.pop()
                else:
                    pop_mark()
            elif op == pickle.POP_MARK:
                pop_mark()
            elif op == pickle.DUP:
                push(stack[-1])
            elif op == pickle.GLOBAL:
                module = self.line()
                push(self.global_(module, self.line()))
            elif op == pickle.STACK_GLOBAL:
                name, module = stack.pop(), stack.pop()
                if type(name) is not str or type(module) is not str:
                    raise refused(self.where, "STACK_GLOBAL needs two "
                                  "strings")
                push(self.global_(module, name))
            elif op == pickle.REDUCE:
                args = stack.pop()
                f = self.callable_(stack[-1], "call")
                if type(args) is not tuple:
                    raise refused(self.where, "REDUCE arguments are not a "
                                  "tuple")
                stack[-1] = f(*args)
            elif op in (pickle.NEWOBJ, pickle.NEWOBJ_EX):
                kw = stack.pop() if op == pickle.NEWOBJ_EX else {}
                args = stack.pop()
                cls = self.callable_(stack[-1], "create an object of")
                if not isinstance(cls, type) or type(args) is not tuple \
                        or type(kw) is not dict:
                    raise refused(self.where, f"NEWOBJ of {_short(cls)}")
                stack[-1] = cls.__new__(cls, *args, **kw)
            elif op == pickle.BUILD:
                state = stack.pop()
                self._build(stack[-1], state)
            elif op == pickle.BINPERSID:
                push(self.persistent_load(stack.pop()))
            elif op == pickle.PROTO:
                take(1)
            elif op == pickle.FRAME:
                take(8)
            elif op == pickle.STOP:
                out = stack.pop()
                check_depth(out, self.where)
                return out
            elif op in _REFUSED or op in _NAMES:
                raise refused(self.where, f"pickle opcode "
                              f"{_NAMES.get(op, op)} is not supported "
                              "(torch.save never writes it)")
            else:
                raise refused(self.where, f"unknown pickle opcode {op!r} "
                              f"at byte {self.pos - 1}")

    def _target(self, obj, kind, opcode):
        if not isinstance(obj, kind) or (
                type(obj) not in (list, dict, set, collections.OrderedDict,
                                  collections.Counter)):
            raise refused(self.where, f"{opcode} on a {type(obj).__name__}"
                          f" (only lists, dicts and sets take items)")
        return obj

    def _build(self, inst, state):
        """BUILD (object state) on an OrderedDict or an allowed class."""
        cls = type(inst)
        if cls is not collections.OrderedDict and \
                self.allowed.get(id(cls)) is not cls:
            raise refused(self.where, "it asks to set the state of a "
                          f"{cls.__module__}.{cls.__qualname__}, which is "
                          "not an allowed global")
        setstate = getattr(inst, "__setstate__", None)
        if setstate is not None and cls is not collections.OrderedDict:
            setstate(state)
            return
        slots = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        if state:
            inst.__dict__.update(state)
        for k, v in (slots or {}).items():
            setattr(inst, k, v)


def _short(obj):
    r = repr(obj)
    return r if len(r) <= 80 else r[:80] + "..."


_CONTAINERS = (list, tuple, dict, set, frozenset)


def check_depth(obj, where, limit=MAX_DEPTH):
    """Raise where containers nest deeper than ``limit`` (iteratively:
    the check itself must not recurse). Each container is entered once,
    so a structure shared through the memo costs its size, not its
    expansion."""
    seen = set()
    todo = [(obj, 1)]
    while todo:
        o, depth = todo.pop()
        if not isinstance(o, _CONTAINERS) or id(o) in seen:
            continue
        if depth > limit:
            raise refused(where, f"its containers nest deeper than {limit} "
                          "levels (a recursion bomb?)", False)
        seen.add(id(o))
        items = o.values() if isinstance(o, dict) else o
        todo.extend([(v, depth + 1) for v in items])
        if isinstance(o, dict):
            todo.extend([(k, depth + 1) for k in o
                         if isinstance(k, tuple)])


def encode(text, encoding="latin1", errors="strict"):
    """``_codecs.encode`` as protocol 2 pickles bytes: str in, bytes out
    (any other argument is a ValueError: codecs can be asked to do odd
    things)."""
    if type(text) is not str or codecs.lookup(encoding).name not in (
            "iso8859-1", "utf-8", "ascii"):
        raise ValueError("_codecs.encode is allowed only for str with "
                         "latin1/utf-8/ascii")
    return codecs.encode(text, encoding, errors)
