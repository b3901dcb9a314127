"""The layer rules of DESIGN.md ("Layers (imports point down only)"), checked
on the source with `ast`, so CI fails when a change breaks them:

(a) collectives/ and launch/ never import dtorch;
(b) no dtorch module imports a module of a higher layer (LAYERS below), at
    module level or inside a function;
(c) no import cycle among dtorch's modules at module level;
(c') no import cycle either once the imports inside functions count too
    (a function-local import that closes a cycle only hides it);
(d) importing dtorch changes nothing process-wide (checked in a subprocess).

Each failure lists every offending import as file:line. Known violations that
the layout helpers of issue 10 are removing are in ALLOWED_UPWARD and
ALLOWED_CYCLE_EDGES, each with its reason; an entry that no longer occurs
fails test_allow_lists_are_current, so the lists only shrink.
"""
import ast
import functools
import os
import textwrap

from helpers import last_json, run_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PACKAGES = ('dtorch', 'collectives', 'launch')

# DESIGN.md's layers, bottom (0) to top. A module belongs to the layer of the
# longest prefix listed here; a module may import its own layer and lower
# ones. A new dtorch module that matches no prefix fails
# test_every_module_has_a_layer: place it here when you add it.
LAYERS = {
    # 0 the device/dtype map and what knows no tensor: array modules, RNG
    # state, CUDA queries, allocator knobs, result tuples, futures
    'dtorch._backend': 0, 'dtorch._malloc': 0, 'dtorch.random': 0,
    'dtorch.cuda': 0, 'dtorch.accelerator': 0, 'dtorch.backends': 0,
    'dtorch.return_types': 0, 'dtorch.futures': 0, 'dtorch._ignored': 0,
    'dtorch._env': 0, 'dtorch._meta': 0, 'dtorch._rank_local': 0,
    # the compiled CPU kernels on raw arrays (numba, optional)
    'dtorch._kernels': 0,
    # the BLAS thread pools' hold under the deterministic switch
    'dtorch._blas_threads': 0,
    # 1 Function (ctx), the backward engine, grad modes, gradcheck
    'dtorch.autograd': 1,
    # 2 every differentiable op
    'dtorch.ops': 2,
    # 3 Tensor, its methods, creation functions, printing
    'dtorch.tensor': 3, 'dtorch._tensor_methods': 3, 'dtorch._creation': 3,
    'dtorch.functional': 3, 'dtorch._settings': 3,
    'dtorch.autograd.functional': 3, 'dtorch._legacy': 3,
    'dtorch._format': 3,
    # torch.linalg (LAPACK primitives + compositions; Tensor.inverse etc.
    # bind its functions, so it knows Tensor only as TensorBase)
    'dtorch.linalg': 3,
    # torch.sparse (its tensor class is dtorch.tensor.SparseTensor)
    'dtorch.sparse': 3,
    # 4 the single-process training stack (siblings; no cycles among them),
    # and the package faces `dtorch` and `dtorch.utils` that re-export it
    # (dtorch.distributed loads lazily, through dtorch.__getattr__)
    'dtorch': 4, 'dtorch.utils': 4, 'dtorch.utils.summary': 4,
    'dtorch.nn': 4, 'dtorch.optim': 4, 'dtorch.utils.data': 4,
    'dtorch.serialization': 4, 'dtorch.amp': 4, 'dtorch.distributions': 4,
    'dtorch.utils.checkpoint': 4, 'dtorch.multiprocessing': 4,
    'dtorch.cpu': 4, 'dtorch.cuda.amp': 4,
    # dtorch.compile (capture and replay of array programs) and its controls
    'dtorch._compile': 4, 'dtorch.compiler': 4,
    # the einops backend (imported after einops) and the hook that loads it
    'dtorch._einops': 4, 'dtorch._einops_hook': 4,
    # 5 torch.distributed-style facade over collectives/, its comm hooks
    'dtorch.distributed': 5,
    # the dry run (dtorch-launch --dry-run) and its byte ledger: over the
    # facade, optim's step hooks and autograd's recorder chain
    'dtorch.distributed.dry_run': 5, 'dtorch.distributed._accounting': 5,
    # 6 DDP, tensor parallel, SyncBatchNorm: over distributed's public API
    'dtorch.nn.parallel': 6,
    # 7 model-level distributed features that wrap or read parallel models
    'dtorch.distributed.checkpoint': 7, 'dtorch.distributed.fsdp': 7,
    'dtorch.distributed.pipelining': 7, 'dtorch.distributed.optim': 7,
    'dtorch.distributed.tensor': 7,
    # elastic training: re-wraps DDP over each new membership (issue 27)
    'dtorch.distributed.elastic': 7,
    # 8 tools that read models, never change training
    'dtorch.onnx': 8, 'dtorch.ao': 8, 'dtorch.profiler': 8,
    'dtorch.quantization': 8,
    'dtorch.utils.tensorboard': 8, 'dtorch.utils.flop_counter': 8,
    'dtorch.utils.step_metrics': 8,
}

# (importer, imported) pairs that break (b) today, with who removes them.
ALLOWED_UPWARD = {
}

# module-level import edges that close a cycle today (c), with who removes
# them; the cycle check ignores them.
ALLOWED_CYCLE_EDGES = {
}

# function-local import edges that close a cycle today (c'), with who
# removes them; the check ignores them. An edge that no longer closes a
# cycle fails test_allow_lists_are_current, so this list only shrinks.
ALLOWED_LOCAL_CYCLE_EDGES = {
}


# ------------------------------------------------------------ the analysis

def find_modules(root=ROOT, packages=PACKAGES):
    """{dotted name: (path, is_package)} for every .py under packages."""
    mods = {}
    for pkg in packages:
        for dp, dn, fn in os.walk(os.path.join(root, pkg)):
            dn[:] = sorted(d for d in dn if d != '__pycache__')
            for f in sorted(fn):
                if not f.endswith('.py'):
                    continue
                rel = os.path.relpath(os.path.join(dp, f), root)[:-3]
                name = rel.replace(os.sep, '.')
                ispkg = name.endswith('.__init__')
                if ispkg:
                    name = name[:-len('.__init__')]
                mods[name] = (os.path.join(dp, f), ispkg)
    return mods


class Import:
    def __init__(self, src, dst, path, line, top, lazy=False):
        self.src, self.dst, self.path, self.line = src, dst, path, line
        self.top = top     # runs when the module is imported
        self.lazy = lazy   # in a module's __getattr__ (PyTorch's path)

    def __repr__(self):
        kind = 'module level' if self.top else (
            "in the module's __getattr__" if self.lazy else 'in a function')
        return (f"{os.path.relpath(self.path, ROOT)}:{self.line}: "
                f"{self.src} imports {self.dst} ({kind})")


def _is_type_checking(node):
    t = node.test
    return (isinstance(t, ast.Name) and t.id == 'TYPE_CHECKING') or (
        isinstance(t, ast.Attribute) and t.attr == 'TYPE_CHECKING')


def _import_module_call(node):
    """(name, package expression) of importlib.import_module('...', pkg)
    or __import__('...') with a literal name, else None."""
    f = node.func
    fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, 'id', '')
    if fname not in ('import_module', '__import__') or not node.args:
        return None
    a = node.args[0]
    if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
        return None
    pkg = node.args[1] if fname == 'import_module' and len(node.args) > 1 \
        else None
    return a.value, pkg


def _walk(node, top, lazy=False, depth=0):
    """(import or call node, runs at import time, in a module __getattr__)
    for every import under node. Class bodies run at import time; function
    bodies do not; imports under `if TYPE_CHECKING:` never run."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, top, lazy
        elif isinstance(child, ast.Call) and _import_module_call(child):
            yield child, top, lazy
            yield from _walk(child, top, lazy, depth)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                ast.Lambda)):
            # a module-level __getattr__ loads PyTorch's attribute paths
            # (dtorch.distributed, nn.parallel) on first use
            is_lazy = lazy or (depth == 0 and getattr(child, 'name', '')
                               == '__getattr__')
            yield from _walk(child, False, is_lazy, depth + 1)
        elif isinstance(child, ast.If) and _is_type_checking(child):
            continue
        elif isinstance(child, ast.ClassDef):
            yield from _walk(child, top, lazy, depth + 1)
        else:
            yield from _walk(child, top, lazy, depth)


def imports_of(name, path, ispkg, mods):
    """Every import in module `name` of a module of our packages."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    here = name if ispkg else name.rpartition('.')[0]
    out = []
    for node, top, lazy in _walk(tree, True):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.Call):
            mod, pkg = _import_module_call(node)
            level = len(mod) - len(mod.lstrip('.'))
            if level:
                pkgname = name if (isinstance(pkg, ast.Name)
                                   and pkg.id == '__name__') else here
                parts = pkgname.split('.')
                parts = parts[:len(parts) - level + 1]
                mod = '.'.join(parts + ([mod[level:]] if mod[level:]
                                        else []))
            targets = [mod]
        else:
            if node.level:
                parts = here.split('.')
                parts = parts[:len(parts) - node.level + 1]
                base = '.'.join(parts + ([node.module] if node.module
                                         else []))
            else:
                base = node.module
            # `from pkg import sub` imports module pkg.sub; any other name
            # is an attribute of pkg, so pkg itself is what is imported
            subs = [f"{base}.{a.name}" for a in node.names
                    if f"{base}.{a.name}" in mods]
            targets = subs
            if len(subs) < len(node.names):
                targets = targets + [base]
        for t in targets:
            if t.split('.')[0] in PACKAGES:
                out.append(Import(name, t, path, node.lineno, top, lazy))
    return out


@functools.lru_cache(maxsize=None)  # the tests only read it: parse once
def all_imports(root=ROOT, packages=PACKAGES):
    mods = find_modules(root, packages)
    return mods, [i for name, (p, ispkg) in mods.items()
                  for i in imports_of(name, p, ispkg, mods)]


def layer_of(name, layers=LAYERS):
    while name:
        if name in layers:
            return layers[name]
        name = name.rpartition('.')[0]
    return None


def upward(imps, layers=LAYERS):
    """Imports of dtorch modules that point to a higher layer. A module's
    __getattr__ may load a higher layer: that is how PyTorch's attribute
    paths (dtorch.distributed, dtorch.nn.parallel, nn.SyncBatchNorm) stay
    reachable while a single-process import loads no distribution code
    (issue 10 item 3); nothing runs it at import time."""
    bad = []
    for i in imps:
        if not (i.src.startswith('dtorch') and i.dst.startswith('dtorch')):
            continue
        if i.lazy:
            continue
        a, b = layer_of(i.src, layers), layer_of(i.dst, layers)
        if a is not None and b is not None and b > a:
            bad.append(i)
    return bad


def cycles(imps, ignore=(), local=False):
    """Strongly connected components (>1 module, or a self-import) of the
    module-level import graph among dtorch modules, each with its edges;
    ``local``: the imports inside functions count too (not those of a
    module's __getattr__, which nothing runs at import time: PyTorch's lazy
    attribute paths)."""
    graph, where = {}, {}
    for i in imps:
        if ((i.top or (local and not i.lazy)) and i.src.startswith('dtorch')
                and i.dst.startswith('dtorch') and i.src != i.dst
                and (i.src, i.dst) not in ignore):
            graph.setdefault(i.src, set()).add(i.dst)
            graph.setdefault(i.dst, set())
            where.setdefault((i.src, i.dst), i)
    # Tarjan, iterative (no recursion limit)
    index, low, on, stack, comps, n = {}, {}, set(), [], [], [0]
    for v0 in sorted(graph):
        if v0 in index:
            continue
        work = [(v0, iter(sorted(graph[v0])))]
        index[v0] = low[v0] = n[0]
        n[0] += 1
        stack.append(v0)
        on.add(v0)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = n[0]
                    n[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))
    return [(c, [where[(a, b)] for a in c for b in sorted(graph[a])
                 if b in c]) for c in comps]


def _report(title, items):
    return title + '\n' + '\n'.join(f"  {x!r}" for x in items)


# --------------------------------------------------------------- the rules

def test_collectives_and_launch_never_import_dtorch():
    _, imps = all_imports()
    bad = [i for i in imps if i.src.split('.')[0] in ('collectives', 'launch')
           and i.dst.split('.')[0] == 'dtorch']
    assert not bad, _report(
        "collectives/ and launch/ must not import dtorch (DESIGN.md):", bad)


def test_every_module_has_a_layer():
    mods = find_modules()
    missing = sorted(m for m in mods
                     if m.startswith('dtorch') and layer_of(m) is None)
    assert not missing, (
        f"dtorch modules with no layer in tests/project/test_layering.py "
        f"LAYERS: {missing}")


def test_imports_point_down():
    _, imps = all_imports()
    bad = [i for i in upward(imps) if (i.src, i.dst) not in ALLOWED_UPWARD]
    assert not bad, _report(
        "imports that point up a layer (LAYERS in "
        "tests/project/test_layering.py, DESIGN.md); call down, or move the "
        "code to the layer it needs:",
        sorted(bad, key=repr))


def test_no_import_cycles():
    _, imps = all_imports()
    found = cycles(imps, ignore=set(ALLOWED_CYCLE_EDGES))
    msg = '\n'.join(
        _report(f"import cycle among {len(c)} modules {c}, edges:", edges)
        for c, edges in found)
    assert not found, msg


def test_no_import_cycles_through_functions():
    """A function-local import does not make a cycle acceptable: it hides
    it from import time only (the modules still depend on each other)."""
    _, imps = all_imports()
    found = cycles(imps, ignore=set(ALLOWED_CYCLE_EDGES)
                   | set(ALLOWED_LOCAL_CYCLE_EDGES), local=True)
    msg = '\n'.join(
        _report(f"import cycle (imports in functions included) among "
                f"{len(c)} modules {c}, edges:", edges)
        for c, edges in found)
    assert not found, msg


def test_allow_lists_are_current():
    """An allowed violation that no longer occurs must leave the list."""
    _, imps = all_imports()
    up = {(i.src, i.dst) for i in upward(imps)}
    top = {(i.src, i.dst) for i in imps if i.top}
    in_cycles = {(e.src, e.dst) for _, edges in cycles(imps, local=True)
                 for e in edges if not e.top}
    stale = [k for k in ALLOWED_UPWARD if k not in up] + [
        k for k in ALLOWED_CYCLE_EDGES if k not in top] + [
        k for k in ALLOWED_LOCAL_CYCLE_EDGES if k not in in_cycles]
    assert not stale, f"remove from the allow-lists (fixed): {stale}"


_PROBE = textwrap.dedent(r'''
    import atexit, ctypes, faulthandler, json, os, signal, sys, threading
    import numpy                       # its own start-up is not dtorch's
    calls = []
    class CDLL(ctypes.CDLL):
        def __getattr__(self, name):
            f = super().__getattr__(name)
            if name in ('mallopt', 'malloc_trim'):
                def rec(*a):
                    calls.append([name] + [int(x) for x in a])
                    return f(*a)
                return rec
            return f
    ctypes.CDLL = CDLL
    hooks = []                         # atexit hooks registered by our code
    _register = atexit.register
    def register(fn, *a, **k):
        where = sys._getframe(1).f_code.co_filename
        if where.startswith(os.getcwd() + os.sep):
            hooks.append(f"{where}: {getattr(fn, '__qualname__', fn)}")
        return _register(fn, *a, **k)
    atexit.register = register
    def tasks():
        return len(os.listdir('/proc/self/task')) if os.path.isdir(
            '/proc/self/task') else 0
    def state():
        return {
            'threads': sorted(t.name for t in threading.enumerate()),
            'os_threads': tasks(),
            'signals': {s.name: repr(signal.getsignal(s))
                        for s in signal.valid_signals()
                        if isinstance(s, signal.Signals)},
            'environ': dict(os.environ),
            'recursionlimit': sys.getrecursionlimit(),
            'switchinterval': sys.getswitchinterval(),
            'excepthook': repr(sys.excepthook),
            'faulthandler': faulthandler.is_enabled(),
            'atexit': list(hooks),
        }
    before = state()
    import dtorch, dtorch.nn, dtorch.optim, dtorch.utils.data  # noqa
    x = dtorch.ones(3, requires_grad=True)
    (x * 2).sum().backward()
    after = state()
    print(json.dumps({'before': before, 'after': after, 'malloc': calls,
                      'collectives': 'collectives' in sys.modules}))
''')


def _probe(**env):
    e = dict(os.environ, OMP_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1',
             **env)
    return last_json(run_python(_PROBE, cwd=ROOT, env=e,
                                timeout=300).stdout)


def _changes(res):
    b, a = res['before'], res['after']
    return {k: (b[k], a[k]) for k in b if b[k] != a[k]}


def test_import_changes_nothing_process_wide():
    """No thread, signal handler, environment variable, interpreter setting
    or atexit hook appears because dtorch was imported and used once; no
    malloc tuning when it is not asked for (DTORCH_MALLOC_TUNING=0)."""
    res = _probe(DTORCH_MALLOC_TUNING='0')
    assert _changes(res) == {}, _changes(res)
    assert res['malloc'] == [], res['malloc']
    assert not res['collectives'], "single-process import loaded collectives"


def test_default_import_only_tunes_malloc():
    """A plain import may tune glibc malloc (the documented, env-guarded
    setting in dtorch._malloc, issue 10 item 1) and nothing else."""
    res = _probe()
    assert _changes(res) == {}, _changes(res)
    assert all(c[0] == 'mallopt' for c in res['malloc']), res['malloc']


# ------------------------------------------------- the checker checks itself

def test_checker_finds_violations(tmp_path):
    """An upward import inside a function, a module-level cycle through a
    package's name, and a dtorch import from collectives are all found."""
    files = {
        'dtorch/__init__.py': 'from . import tensor\nX = 1\n',
        'dtorch/_backend.py': '',
        'dtorch/tensor.py': ('from . import _backend\nfrom . import X\n'
                             'from . import ops\n'),
        'dtorch/ops/__init__.py': (
            'from .. import _backend\n'
            'def f():\n    from ..tensor import Tensor\n'),
        'dtorch/nn/__init__.py': (
            'from typing import TYPE_CHECKING\n'
            'if TYPE_CHECKING:\n    from ..distributed import x\n'
            'def __getattr__(name):\n    import importlib\n'
            '    return importlib.import_module(".parallel", __name__)\n'),
        'dtorch/nn/parallel.py': '',
        'dtorch/optim.py': (
            'import importlib\n'
            'def f():\n    importlib.import_module("dtorch.distributed")\n'),
        'dtorch/distributed.py': '',
        'collectives/__init__.py': 'class A:\n    import dtorch.ops\n',
        'launch/__init__.py': '',
    }
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    mods, imps = all_imports(str(tmp_path))
    assert set(mods) >= {'dtorch', 'dtorch.ops', 'dtorch.tensor'}
    up = [(i.src, i.dst, i.top) for i in upward(imps)]
    assert ('dtorch.ops', 'dtorch.tensor', False) in up
    assert ('dtorch.tensor', 'dtorch', True) in up      # `from . import X`
    assert not any(i[0] == 'dtorch.nn' for i in up)     # TYPE_CHECKING, lazy
    assert ('dtorch.optim', 'dtorch.distributed', False) in up
    assert [(i.dst, i.lazy) for i in imps if i.src == 'dtorch.nn'
            and i.dst.startswith('dtorch')] == [('dtorch.nn.parallel', True)]
    comps = [c for c, _ in cycles(imps)]
    assert ['dtorch', 'dtorch.tensor'] in comps
    assert not any('dtorch.ops' in c for c in comps)    # function-local
    # ... which the function-local check sees (tensor imports ops at module
    # level, ops imports tensor in a function); nn's lazy __getattr__
    # import does not count
    local = [c for c, _ in cycles(imps, local=True)]
    assert any('dtorch.ops' in c and 'dtorch.tensor' in c for c in local)
    assert not any('dtorch.nn.parallel' in c for c in local)
    assert [(i.src, i.dst) for i in imps if i.src == 'collectives'] == [
        ('collectives', 'dtorch.ops')]
