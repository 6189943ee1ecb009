"""No import runs back up the package's arrows: tools -> analysis -> engine -> swap / models -> attention.

Every module of softfree_mm/ is parsed (nothing is imported) and each import statement, module level or inside a
function, is checked against its layer's rule; ``softfree_mm/__init__.py`` and ``registry.py`` wire the layers
together and may import anything.
"""
import ast
import os.path as osp
import pathlib
import sys

import pytest

from tests.helpers import ROOT as REPOSITORY

ROOT = pathlib.Path(REPOSITORY)
PACKAGE = ROOT / 'softfree_mm'
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


def test_no_import_runs_back_up_the_layers():
    assert modules(), f'no modules found under {PACKAGE}'
    assert violations() == []


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
