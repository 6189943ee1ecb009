"""One file per foreign library; each registers its adapters (``swap.adapter.register``) when imported. Every
module here is imported, so a new library's adapters are one new file. Adapters name the classes they handle by
'module.Qualname' and import no foreign library."""
import importlib
import pkgutil

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
    importlib.import_module(f'{__name__}.{_info.name}')
