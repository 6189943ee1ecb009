"""No import runs back up the package's arrows: tools -> analysis -> engine -> swap / models -> attention.

Every module of softfree_mm/ is parsed (nothing is imported) and each import statement, module level or inside a
function, is checked against its layer's rule; ``softfree_mm/__init__.py`` and ``registry.py`` wire the layers
together and may import anything. The package never imports from tools/ nor edits ``sys.path``; a tool (a file of
tools/ that runs as a command: it has a ``__main__`` block) imports no other tool, only the package and the tools'
helpers (the files without one: what must run before the package is imported, such as the warning filters).
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
FREE = {'softfree_mm', 'softfree_mm.registry'}  # the wiring modules
# what each layer must not import (by package prefix); attention/ is checked by what it may import instead
FORBIDDEN = {
    'models': ('softfree_mm.engine', 'softfree_mm.analysis'),
    'swap': ('softfree_mm.engine', 'softfree_mm.analysis'),
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
                        found.append(f'{where}:{line}: {mod} ({layer}/ must not import {bad.split(".")[1]}/)')
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
