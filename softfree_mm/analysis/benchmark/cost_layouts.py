"""The cost sweep's set-ups (``cost.py``): the layouts and kernels it measures, which backbone config each kernel has
in each layout (its own detection config's backbone where it has one, else softmax's with the kernel in place, the
layout's settings over it), the declared class of that set-up, and the whole models' configs; read from configs/,
built only to see that the layout takes the kernel."""
import os.path as osp
from collections import OrderedDict
from typing import Optional, Tuple

# layout -> (the backbone of configs/maskrcnn_<backbone>_<kernel>.py, what the layout sets over its config)
COST_LAYOUTS = OrderedDict(
    xcit_s12=('xcit_s12', {}),
    pvt_v2_b2=('pvt_v2_b2', dict(sr_ratios=(8, 4, 2, 1))),  # with spatial reduction, as softmax's config
    pvt_v2_b2_nosr=('pvt_v2_b2', dict(sr_ratios=(1, 1, 1, 1))),  # without, as the InLine and SOFT configs
    swin_t=('swin_t', {}),
    cswin_t=('cswin_t', {}),
)
COST_KERNELS = ('softmax', 'poly3', 'linear', 'inline', 'soft', 'soft-l64', 'soft-l256', 'agent')
KERNEL_CFGS = {'softmax': dict(type='softmax'), 'poly3': dict(type='poly', degree=3),
               'linear': dict(type='linear', feature_map='elu+1'), 'inline': dict(type='inline'),
               'soft': dict(type='soft'), 'agent': dict(type='agent')}
# a form of a kernel that no config ships: (the kernel whose config it starts from, what it sets on each of that
# kernel's entries in the config's attn_cfg). SOFT with a fixed number of landmarks is linear in N; the shipped
# configs keep the official ratio form (m = N / ratio^2 landmarks: quadratic, its Newton steps cubic)
KERNEL_FORMS = {'soft-l64': ('soft', dict(num_landmarks=64)), 'soft-l256': ('soft', dict(num_landmarks=256))}
KERNEL_NAMES = tuple(k for k in COST_KERNELS if k in KERNEL_CFGS or k in KERNEL_FORMS)  # what --kernels takes
# with --layouts, in the sweep's order


def _root() -> str:
    return osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def _plain(cfg):
    """A config node as plain dicts, SyncBN as BN (one process), no pretrained start."""
    if hasattr(cfg, 'to_dict'):
        cfg = cfg.to_dict()
    if isinstance(cfg, dict):
        out = {k: _plain(v) for k, v in cfg.items() if k != 'init_cfg'}
        if out.get('type') in ('SyncBN', 'MMSyncBN'):
            out['type'] = 'BN'
        return out
    if isinstance(cfg, (list, tuple)):
        return type(cfg)(_plain(v) for v in cfg)
    return cfg


def layout_backbone(layout: str, kernel: str) -> Tuple[Optional[dict], str, str]:
    """(backbone config, the config it comes from, '') of ``kernel`` in ``layout``: the kernel's own detection
    config's backbone where it has one, else softmax's with the kernel in place; with the layout's settings over it.
    Where the layout does not take the kernel: (None, config, the build error's line)."""
    from mmengine.registry import DefaultScope

    from ...registry import MODELS
    if layout not in COST_LAYOUTS:
        raise ValueError(f'unknown layout {layout!r}; valid: {", ".join(COST_LAYOUTS)}')
    if kernel not in KERNEL_NAMES:
        raise ValueError(f'unknown kernel {kernel!r}; valid: {", ".join(KERNEL_NAMES)}')
    cfg, source = _layout_cfg(layout, kernel)
    try:
        with DefaultScope.overwrite_default_scope('softfree_mm'):
            MODELS.build(dict(cfg, arch=cfg.get('arch')) if 'arch' in cfg else cfg)
    except (ValueError, TypeError, KeyError) as e:
        return None, osp.relpath(source, _root()), (str(e).splitlines() or [type(e).__name__])[0]
    return cfg, osp.relpath(source, _root()), ''


def _layout_cfg(layout: str, kernel: str) -> Tuple[dict, str]:
    """(backbone config, the config file it comes from) of ``kernel`` in ``layout``, not built."""
    from ...engine.config_checks import read_config
    base, form = KERNEL_FORMS.get(kernel, (kernel, None))
    bb, extra = COST_LAYOUTS[layout]
    own = osp.join(_root(), 'configs', f'maskrcnn_{bb}_{base}.py')
    source = own if osp.isfile(own) else osp.join(_root(), 'configs', f'maskrcnn_{bb}_softmax.py')
    cfg = _plain(read_config(source).model.backbone)
    if source != own:
        cfg['attn_cfg'] = dict(KERNEL_CFGS[base])
    if form is not None:
        cfg['attn_cfg'] = _with_form(cfg['attn_cfg'], KERNEL_CFGS[base]['type'], form)
    cfg.update(extra)
    return cfg, source


CLASSES = ('linear', 'quadratic', 'cubic')


def layout_class(layout: str, kernel: str) -> str:
    """The declared class (``complexity``) of ``kernel``'s set-up in ``layout``: the worst over every kernel its
    backbone config holds (the official InLine / Agent set-ups keep softmax in their last stages), read from the
    config and the family's preset, not built."""
    from ...attention import build_attention
    from ...models.family import FAMILIES
    cfg, _ = _layout_cfg(layout, kernel)
    attn = cfg.get('attn_cfg')
    if attn is None:
        arch = cfg.get('arch')
        preset = FAMILIES[cfg['type']].arch_zoo.get(arch, {}) if isinstance(arch, str) else dict(arch or {})
        attn = preset.get('attn_cfg', 'softmax')

    def entries(a):
        if isinstance(a, (list, tuple)):
            return [e for x in a for e in entries(x)]
        return [dict(type=a) if isinstance(a, str) else dict(a)]
    found = {build_attention(e, num_heads=1, head_dim=8).complexity for e in entries(attn)}
    return max(found, key=CLASSES.index)


def _with_form(attn_cfg, kernel_type: str, form: dict):
    """``attn_cfg`` (one entry or a list of them) with ``form`` set on every entry of ``kernel_type``."""
    if isinstance(attn_cfg, (list, tuple)):
        return type(attn_cfg)(_with_form(c, kernel_type, form) for c in attn_cfg)
    entry = dict(type=attn_cfg) if isinstance(attn_cfg, str) else dict(attn_cfg)
    return dict(entry, **form) if entry.get('type') == kernel_type else attn_cfg


def model_config(task: str, backbone: str, kernel: str):
    """The whole model of configs/<task>_<backbone>_<kernel>.py, without pretrained starts, BN for SyncBN."""
    from ...engine.config_checks import read_config
    cfg = read_config(osp.join(_root(), 'configs', f'{task}_{backbone}_{kernel}.py'))
    model = _plain(cfg.model)
    return cfg, model
