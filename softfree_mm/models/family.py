"""The family table: what each backbone family declares to the package's tools, and who declared it.

A leaf module (typing only): the backbone kit (``backbones/base.py``, which declares families through
``register_family``) and the converters (which look families up by name) both read it, so neither imports the other
for it.
"""
from typing import Callable, Dict, Optional, Tuple, Union


class Family:
    """What a backbone family declares for the package's tools (the converter, the hooks, the support table, the
    benchmark, the tests): a ``family`` attribute of its class, read from there; no central table names a family.

    Args:
        tiny: build arguments of a small instance: the tests and the support table build it with every kernel and run
            it on odd image sizes.
        fit: ``(label, build arguments)`` of the set-up under which kernels that the family's own layout refuses
            run (global windows, no spatial reduction), or None when there is none.
        checkpoints: checkpoint kind (the converter's family name) -> build arguments of a small instance whose
            state dict holds every name a converted file of that kind may use (family detection compares files with
            it); files convert through the class's ``_convert``. Kinds are unique over all families.
        arch_spec: how the architecture shows in a converted state dict
            (:class:`softfree_mm.models.converters.spec.ArchSpec`), for the one-line errors of a file of another
            architecture; None when the family has none.
        benchmark: preset names that ``tools/benchmark.py`` builds -> build arguments (unique over all families).
        mixes: what its attention mixes, ``'tokens'`` (token attention: an N x N map over positions) or
            ``'channels'`` (XCiT's cross-covariance attention: a d x d map per head); the warm start's default recipe
            is chosen per layout (``softfree_mm.engine.warm_start.LAYOUT_DEFAULTS``).
        layout: which tokens meet in its attention, one of :attr:`LAYOUTS`, or a function of a config's backbone
            dict (its build arguments) that returns one (PVT: spatial reduction or not, by preset and
            ``sr_ratios``); None: not declared. The warm start says in one line when a backbone's layout is not the
            one its default recipe was measured on (``softfree_mm.engine.warm_start.default_origin``).
        downstream_padding: checkpoint kind -> the build arguments of the padding rule that kind's released
            detectors and segmentors were trained with (windows attending zero pad keys, patch grids rounded down),
            where it is not the family's default; ``tools/convert_checkpoint.py --whole`` names them and records them
            in the file's meta. Kinds not named have no downstream release or pad as the default does.
    """

    MIXES = ('tokens', 'channels')
    # 'global tokens': every position against every position; 'reduced keys': positions against spatially reduced
    # (strided or pooled) keys; 'windows' / 'stripes': positions within local windows / cross-shaped stripes;
    # 'channels': XCiT's d x d cross-covariance per head
    LAYOUTS = ('global tokens', 'reduced keys', 'windows', 'stripes', 'channels')

    def __init__(self, tiny: dict, fit: Optional[Tuple[str, dict]] = None,
                 checkpoints: Optional[Dict[str, dict]] = None, arch_spec=None,
                 benchmark: Optional[Dict[str, dict]] = None, mixes: str = 'tokens',
                 layout: Union[str, Callable[[dict], str], None] = None,
                 downstream_padding: Optional[Dict[str, dict]] = None):
        if not isinstance(tiny, dict):
            raise TypeError(f'Family: tiny must be a dict of build arguments, got {tiny!r}')
        if fit is not None and not (isinstance(fit, tuple) and len(fit) == 2 and isinstance(fit[0], str)
                                    and isinstance(fit[1], dict)):
            raise TypeError(f'Family: fit must be None or (label, build arguments), got {fit!r}')
        if mixes not in self.MIXES:
            raise ValueError(f'Family: mixes must be one of {list(self.MIXES)}, got {mixes!r}')
        if not (layout is None or callable(layout) or layout in self.LAYOUTS):
            raise ValueError(f'Family: layout must be None, one of {list(self.LAYOUTS)} or a function of the '
                             f'backbone config, got {layout!r}')
        self.tiny, self.fit, self.arch_spec, self.mixes, self._layout = tiny, fit, arch_spec, mixes, layout
        self.checkpoints, self.benchmark = dict(checkpoints or {}), dict(benchmark or {})
        self.downstream_padding = {k: dict(v) for k, v in (downstream_padding or {}).items()}
        unknown = set(self.downstream_padding) - set(self.checkpoints)
        if unknown:
            raise ValueError(f'Family: downstream_padding names checkpoint kinds it does not declare: {sorted(unknown)}')

    def layout(self, backbone: dict) -> Optional[str]:
        """Which tokens meet in the attention of the backbone a config's ``backbone`` dict builds (None: not
        declared)."""
        found = self._layout(dict(backbone)) if callable(self._layout) else self._layout
        if found is not None and found not in self.LAYOUTS:
            raise ValueError(f'Family: the layout function returned {found!r}; valid: {list(self.LAYOUTS)}')
        return found


FAMILIES: Dict[str, type] = {}  # class name -> backbone class, in the order the families were declared
