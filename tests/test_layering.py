"""No import runs back up the package's arrows: tools -> analysis -> engine -> swap / models -> attention.

Every module of softfree_mm/ is parsed (nothing is imported) and each import statement, module level or inside a
function, is checked against its layer's rule; ``softfree_mm/__init__.py`` and ``registry.py`` wire the layers
together and may import anything. The package never imports from tools/ nor edits ``sys.path``; a tool (a file of
tools/ that runs as a command: it has a ``__main__`` block) imports no other tool, only the package and the tools'
helpers (the files without one: what must run before the package is imported, such as the warning filters).
No import circle among the package's modules (imports inside functions count), but for a package's ``__init__``
importing its own submodules so that they register. docs/contributing.md states these rules for contributors.
"""
import ast
import os.path as osp
import pathlib
import sys

import pytest

from tests.helpers import ROOT as REPOSITORY

ROOT = pathlib.Path(REPOSITORY)
PACKAGE = ROOT / 'softfree_mm'
TOOLS = ROOT / 'tools'
FREE = {'softfree_mm', 'softfree_mm.registry'}  # the wiring modules (models/ and swap/ never import the registry)
# what each layer must not import (by package prefix); attention/ is checked by what it may import instead
FORBIDDEN = {
    'models': ('softfree_mm.engine', 'softfree_mm.analysis', 'softfree_mm.registry'),
    'swap': ('softfree_mm.engine', 'softfree_mm.analysis', 'softfree_mm.registry'),
    'engine': ('softfree_mm.analysis', ),
}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def imports(path: pathlib.Path):
    """(line, imported module, at module level) for every import in the file; relative imports resolved."""
    name = module_name(path)
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')[:len(package.split('.')) - node.level + 1]
                stem = '.'.join(base + ([node.module] if node.module else []))
            else:
                stem = node.module
            # `from pkg import mod` may name a submodule: the names are checked as modules too
            for mod in dict.fromkeys([stem] + [f'{stem}.{alias.name}' for alias in node.names]):
                yield node.lineno, mod, id(node) in top


def layer_of(name: str):
    parts = name.split('.')
    return parts[1] if len(parts) > 1 else None


def modules():
    return sorted(p for p in PACKAGE.rglob('*.py') if '__pycache__' not in p.parts)


def violations():
    stdlib = set(sys.stdlib_module_names)
    found = []
    # attention modules that import triton at module level: only reachable through a lazy (in-function) import
    triton_modules = {module_name(p) for p in modules() if layer_of(module_name(p)) == 'attention'
                      and any(m.split('.')[0] == 'triton' and top for _, m, top in imports(p))}
    for path in modules():
        name = module_name(path)
        if name in FREE:
            continue
        layer = layer_of(name)
        where = osp.relpath(path, ROOT)
        for line, mod, top in imports(path):
            root = mod.split('.')[0]
            if any(f.startswith(f'{where}:{line}: ') for f in found):
                continue  # one report per import statement
            if layer == 'attention':
                if root == 'triton':
                    continue  # a module importing it is itself imported lazily (below)
                if root == 'softfree_mm':
                    if not mod.startswith('softfree_mm.attention'):
                        found.append(f'{where}:{line}: {mod} (attention/ imports only attention/)')
                    elif top and mod in triton_modules:
                        found.append(f'{where}:{line}: {mod} imports triton: import it inside a function')
                elif root not in stdlib and root != 'torch':
                    found.append(f'{where}:{line}: {mod} (attention/ imports torch and the standard library only)')
            else:
                for bad in FORBIDDEN.get(layer, ()):
                    if mod == bad or mod.startswith(bad + '.'):
                        what = bad.split('.')[1] + ('.py' if bad == 'softfree_mm.registry' else '/')
                        found.append(f'{where}:{line}: {mod} ({layer}/ must not import {what})')
    return found


def import_graph():
    """module -> the package's modules it imports (module level or inside a function), itself left out."""
    paths = {module_name(p): p for p in modules()}
    return {name: {mod for _, mod, _ in imports(path) if mod in paths and mod != name} for name, path in paths.items()}


def _strong_components(nodes, edges):
    """Tarjan's strongly connected components of more than one module (each sorted), over ``nodes`` only."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v] & nodes):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def circles(edges=None):
    """The import circles among the package's modules, each a sorted list of its modules.

    A package's ``__init__`` importing its own submodules so that they register, while they import names from it
    (the kernel registry's idiom), is not a circle: within a component that lies wholly inside a package whose
    ``__init__`` belongs to it, that ``__init__``'s imports of its own submodules are set aside and what still
    loops is reported. A loop that leaves the package (``models/__init__ -> models/x -> registry -> models``) is one.
    """
    edges = import_graph() if edges is None else edges
    packages = {n for n, p in ((module_name(p), p) for p in modules()) if p.name == '__init__.py'}
    found = []

    def check(nodes, edges):
        for comp in _strong_components(nodes, edges):
            owner = next((p for p in sorted(comp, key=len)
                          if p in packages and all(m == p or m.startswith(p + '.') for m in comp)), None)
            if owner is None:
                found.append(comp)
                continue
            cut = dict(edges)
            cut[owner] = {w for w in edges[owner] if not w.startswith(owner + '.')}
            check(set(comp), cut)

    check(set(edges), edges)
    return found


def tool_files():
    """stem -> (path, runs as a command) for every Python file of tools/ (tools import each other by bare name)."""
    out = {}
    for path in sorted(TOOLS.rglob('*.py')):
        tree = ast.parse(path.read_text(), filename=str(path))
        out[path.stem] = (path, any(isinstance(node, ast.If) and "__name__ == '__main__'" in ast.unparse(node.test)
                                    for node in tree.body))
    return out


def _edits_sys_path(path: pathlib.Path):
    """Lines that change ``sys.path`` (insert, append, extend, assignment)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if target is not None and ast.unparse(target) in ('sys.path', 'sys.path[:]'):
            yield node.lineno


def tools_violations():
    """A package module importing from tools/ or editing sys.path, a tool importing another tool."""
    tools = tool_files()
    found = []
    for path in modules():
        where = osp.relpath(path, ROOT)
        found += [f'{where}:{line}: edits sys.path (the package imports only what is installed)'
                  for line in _edits_sys_path(path)]
        for line, mod, _ in _first_per_statement(imports(path)):
            if mod.split('.')[0] in tools or mod.split('.')[0] == 'tools':
                found.append(f'{where}:{line}: {mod} (the package never imports from tools/)')
    for stem, (path, _) in tools.items():
        for line, mod, _ in _first_per_statement(imports(path)):
            other = tools.get(mod.split('.')[0])
            if other is not None and other[1] and other[0] != path:
                found.append(f'{osp.relpath(path, ROOT)}:{line}: {mod} (a tool imports another tool: what they '
                             'share belongs in softfree_mm/)')
    return sorted(found)


def _first_per_statement(found):
    """One (line, module, top) per import statement: ``from b import main`` also yields ``b.main``."""
    lines = set()
    for line, mod, top in found:
        if line not in lines:
            lines.add(line)
            yield line, mod, top


def test_no_import_runs_back_up_the_layers():
    assert modules(), f'no modules found under {PACKAGE}'
    assert violations() == []


def test_no_import_circle_among_the_packages_modules():
    graph = import_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100, 'the parser finds the imports'
    assert circles(graph) == []


@pytest.mark.parametrize('files,expected', [
    # through imports inside functions too, across layers
    ({'models/__init__.py': 'from .transfer import T\n', 'models/transfer.py': 'def f():\n    from .. import reg\n',
      'reg.py': 'from . import models\n'}, [['softfree_mm.models', 'softfree_mm.models.transfer', 'softfree_mm.reg']]),
    # two plain modules
    ({'models/a.py': 'from .b import x\n', 'models/b.py': 'def f():\n    from .a import y\n'},
     [['softfree_mm.models.a', 'softfree_mm.models.b']]),
    # the registry idiom: the package's __init__ imports its submodules, which take names from it
    ({'attention/__init__.py': 'REG = {}\nfrom . import poly, soft\n', 'attention/poly.py': 'from . import REG\n',
      'attention/soft.py': 'from . import REG\nfrom .poly import x\n'}, []),
    # ... but a loop among those submodules still is one
    ({'attention/__init__.py': 'from . import poly, soft\n', 'attention/poly.py': 'from . import soft\n',
      'attention/soft.py': 'from .poly import x\n'}, [['softfree_mm.attention.poly', 'softfree_mm.attention.soft']]),
])
def test_the_circle_check_finds_loops_and_leaves_the_registry_idiom(tmp_path, monkeypatch, files, expected):
    pkg = tmp_path / 'softfree_mm'
    for rel, source in {'__init__.py': '', 'models/__init__.py': '', 'attention/__init__.py': '', **files}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(source)
    monkeypatch.setattr(sys.modules[__name__], 'PACKAGE', pkg)
    monkeypatch.setattr(sys.modules[__name__], 'ROOT', tmp_path)
    assert circles() == expected


def test_no_tool_imports_another_and_the_package_nothing_of_tools():
    tools = tool_files()
    assert sum(runs for _, runs in tools.values()) >= 10, tools  # the parser finds the tools
    assert tools_violations() == []


@pytest.mark.parametrize('where,source,expected', [
    ('tools/a.py', 'import b\nif __name__ == \'__main__\':\n    b.main()\n', 'a tool imports another tool'),
    ('tools/analysis/a.py', 'def main():\n    from b import main\nif __name__ == \'__main__\':\n    main()\n',
     'a tool imports another tool'),
    ('softfree_mm/engine/x.py', 'def f():\n    from b import main\n', 'the package never imports from tools/'),
    ('softfree_mm/engine/x.py', 'import sys\nsys.path.insert(0, "tools")\n', 'edits sys.path'),
    ('softfree_mm/analysis/x.py', 'import sys\nsys.path = ["x"]\n', 'edits sys.path'),
])
def test_the_check_catches_tools_importing_tools_and_the_package_reaching_into_tools(tmp_path, monkeypatch, where,
                                                                                   source, expected):
    (tmp_path / 'tools' / 'analysis').mkdir(parents=True)
    (tmp_path / 'softfree_mm' / 'engine').mkdir(parents=True)
    (tmp_path / 'softfree_mm' / 'analysis').mkdir()
    (tmp_path / 'tools' / 'b.py').write_text("def main():\n    pass\nif __name__ == '__main__':\n    main()\n")
    # allowed: a tool importing a helper (no __main__ block) and the package
    (tmp_path / 'tools' / 'helper.py').write_text('X = 1\n')
    (tmp_path / 'tools' / 'c.py').write_text("import helper\nimport softfree_mm\n"
                                             "if __name__ == '__main__':\n    pass\n")
    (tmp_path / where).write_text(source)
    monkeypatch.setattr(sys.modules[__name__], 'PACKAGE', tmp_path / 'softfree_mm')
    monkeypatch.setattr(sys.modules[__name__], 'TOOLS', tmp_path / 'tools')
    monkeypatch.setattr(sys.modules[__name__], 'ROOT', tmp_path)
    found = tools_violations()
    assert len(found) == 1 and found[0].startswith(f'{where}:') and expected in found[0], found


@pytest.mark.parametrize('layer,source,expected', [
    ('engine', 'from ..analysis.norms import call_stats\n', 'engine/ must not import analysis/'),
    ('engine/hooks', 'def f():\n    from ...analysis import layouts\n', 'engine/ must not import analysis/'),
    ('swap', 'import softfree_mm.engine.launch\n', 'swap/ must not import engine/'),
    ('engine', 'from softfree_mm import analysis\n', 'engine/ must not import analysis/'),
    ('models', 'from ..analysis import probe\n', 'models/ must not import analysis/'),
    ('models', 'def f():\n    from ..registry import MODELS\n', 'models/ must not import registry.py'),
    ('swap', 'from softfree_mm import registry\n', 'swap/ must not import registry.py'),
    ('attention', 'import numpy as np\n', 'torch and the standard library only'),
    ('attention', 'from ..models import layers\n', 'attention/ imports only attention/'),
    ('attention', 'from .kernels_src import launch\n', 'imports triton: import it inside a function'),
    ('attention', 'def f():\n    import numpy\n', 'torch and the standard library only'),
])
def test_the_check_catches_an_import_up_the_arrows(tmp_path, monkeypatch, layer, source, expected):
    """The checker itself: an offending file dropped into a layer is reported with its line."""
    pkg = tmp_path / 'softfree_mm'
    (pkg / layer).mkdir(parents=True)
    (pkg / layer / 'offender.py').write_text(source)
    (pkg / 'attention').mkdir(exist_ok=True)
    # allowed: the standard library, torch, attention/ itself, triton inside a function or in a module that is
    # only imported inside functions
    (pkg / 'attention' / 'fine.py').write_text('import math\nimport torch\nfrom . import fine\n'
                                               'def f():\n    import triton\n    from . import kernels_src\n')
    (pkg / 'attention' / 'kernels_src.py').write_text('import triton\nimport triton.language as tl\n')
    monkeypatch.setattr(sys.modules[__name__], 'PACKAGE', pkg)
    monkeypatch.setattr(sys.modules[__name__], 'ROOT', tmp_path)
    found = violations()
    assert len(found) == 1 and f'{layer}/offender.py:' in found[0] and expected in found[0], found
