"""The docs' extension examples (a kernel, a backbone family) as a user has them: modules of one's own, written to a
folder outside the package and imported from there, then taken out of the registries again so that later tests in
the same process see the package as it ships."""
import importlib.util
import os.path as osp
import re
import sys

from tests.helpers import ROOT


def doc_example(page: str, heading: str) -> str:
    """The first ```python block under ``## heading`` of docs/<page>."""
    with open(osp.join(ROOT, 'docs', page), encoding='utf-8') as f:
        text = f.read()
    start = text.index(f'\n## {heading}\n')
    return re.search(r'```python\n(.*?)```', text[start:], re.S).group(1)


def load_example(source: str, name: str, folder) -> object:
    """``source`` written to ``folder/name.py`` and imported as the module ``name``."""
    path = osp.join(str(folder), f'{name}.py')
    with open(path, 'w', encoding='utf-8') as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def forget_kernel(name: str) -> None:
    from softfree_mm.attention import ATTENTION
    ATTENTION._map.pop(name, None)


def forget_family(cls_name: str) -> None:
    """The family out of the tools' declarations and every MODELS registry it went into."""
    from softfree_mm import registry
    from softfree_mm.models.family import FAMILIES
    from softfree_mm.models.converters import detect
    cls = FAMILIES.pop(cls_name, None)
    for reg in registry._downstream_registries().values():
        if reg.module_dict.get(cls_name) is cls:
            reg._module_dict.pop(cls_name)
    for kind in getattr(getattr(cls, 'family', None), 'checkpoints', {}):
        detect._PATTERNS.pop(kind, None)
