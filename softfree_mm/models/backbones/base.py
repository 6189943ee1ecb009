"""The backbone kit every family uses: presets resolved one way (a name or a dict), output-index and freezing
checks, freezing and ``train()``, one default initialisation that leaves kernels theirs, gradient checkpointing in
training only, layer depths (layer-wise lr decay) and ``Pretrained`` loading through the family's converter."""
import numbers
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from timm.layers import trunc_normal_
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ...attention import AttentionKernel
from ..utils.cfg import is_cfg
from ..family import FAMILIES, Family  # noqa: F401  (the table lives in a leaf; re-exported here)
from ..utils.pretrained import init_from_cfg, resolve_pretrained


def checkpointed(owner: nn.Module, fn: Callable, *args):
    """``fn(*args)``, under activation checkpointing when ``owner.with_cp`` and ``owner`` is training and the first
    input needs a gradient (in eval nothing would ever be recomputed); also in eval mode when the owner's
    ``checkpoint_in_eval`` says so and gradients are on (attention transfer trains a student kept in eval mode, each
    block fed a recorded input that needs no gradient)."""
    if owner.with_cp and torch.is_grad_enabled() and (
            (owner.training and args[0].requires_grad) or getattr(owner, 'checkpoint_in_eval', False)):
        return cp.checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


class AttentionBlock(nn.Module):
    """A residual attention block of a backbone (x -> x + attention -> ... -> x + MLP, same shape in and out): the
    unit attention transfer matches one by one (softfree_mm/models/transfer.py). A family's blocks subclass it.

    The contract transfer relies on (checked when it is built): the block is called with its tokens as the first
    positional argument and returns one tensor shaped as them."""

    def __call__(self, *args, **kwargs):
        # attention transfer (softfree_mm/models/transfer.py) hands a student block its twin's recorded input, or
        # for a block identical to its twin the twin's output; set on the block, not by hooks, so that a checkpointed
        # block recomputed in the backward pass sees the same
        sub = self.__dict__.get('_transfer_substitute')
        if sub is not None:
            x, out = sub
            if out is not None:
                return out
            args = (x, *args[1:])
        return super().__call__(*args, **kwargs)

    def passthrough(self, x: torch.Tensor) -> torch.Tensor:
        """What the block returns when its attention and MLP add nothing: ``x`` for a pre-norm block (x + f(norm(x)));
        a post-norm block overrides it (its norms still act). Transfer's loss divides each block's error by the mean
        square of output minus this: what the block adds to its stream."""
        return x


def register_family(cls):
    """Declare ``cls`` a backbone family to the package's tools (a class decorator); its ``family`` attribute says
    what they read. Registering it into the OpenMMLab registries is ``softfree_mm.registry.register_backbone``."""
    if not (isinstance(cls, type) and issubclass(cls, SoftFreeBackbone)):
        raise TypeError(f'register_family: {cls!r} is no SoftFreeBackbone subclass')
    if not isinstance(cls.__dict__.get('family'), Family):
        raise TypeError(f'register_family: {cls.__name__} declares no family = Family(...) of its own')
    if cls.__name__ in FAMILIES and FAMILIES[cls.__name__] is not cls:
        raise KeyError(f'register_family: a family {cls.__name__!r} is already declared by {FAMILIES[cls.__name__]}')
    for what in ('checkpoints', 'benchmark'):
        taken = {n: other.__name__ for other in FAMILIES.values() if other is not cls
                 for n in getattr(other.family, what)}
        clash = sorted(set(getattr(cls.family, what)) & set(taken))
        if clash:
            raise KeyError(f'register_family: {cls.__name__} declares {what} {clash}, already declared by '
                           f'{", ".join(sorted({taken[n] for n in clash}))}')
    if cls.family.checkpoints and cls._convert is None:
        raise TypeError(f'register_family: {cls.__name__} declares checkpoints but no _convert function')
    FAMILIES[cls.__name__] = cls
    return cls


def kernel_owned(module: nn.Module) -> set:
    """The ids of every module inside an attention kernel of ``module`` (kernels initialise their own)."""
    return {id(m) for k in module.modules() if isinstance(k, AttentionKernel) for m in k.modules()}


def mmdet_checks(attn_drop_rate, act_cfg, norm_cfg, convert_weights, ln_eps: Optional[float] = None) -> dict:
    """``check_foreign_args`` entries for what mmdet's backbones take that has one meaning here: no attention
    dropout, GELU, LayerNorm (``ln_eps``), checkpoints always converted; None means the default."""
    eps = {} if ln_eps is None else dict(eps=ln_eps)
    norms = "dict(type='LN'" + ('' if ln_eps is None else ', eps=' + str(ln_eps).replace('e-0', 'e-')) + ')'
    return dict(
        attn_drop_rate=(attn_drop_rate, attn_drop_rate == 0,
                        'no dropout on attention weights: a kernel may never form them'),
        act_cfg=(act_cfg, act_cfg is None or is_cfg(act_cfg, 'GELU'), "the MLP's activation is dict(type='GELU')"),
        norm_cfg=(norm_cfg, norm_cfg is None or is_cfg(norm_cfg, 'LN', **eps), f'the norms are {norms}'),
        convert_weights=(convert_weights, isinstance(convert_weights, bool),
                         'True or False: checkpoints are always converted'))


class SoftFreeBackbone(BaseModule):
    """Base of every softfree_mm backbone (subclass it for a new one).

    * ``pretrained=PATH``: the deprecated alias mmdet's and mmseg's backbones take (mmseg's ``EncoderDecoder`` hands
      a model-level ``pretrained`` to its backbone) for ``init_cfg=dict(type='Pretrained', checkpoint=PATH)``.
    * ``init_cfg=dict(type='Pretrained', checkpoint=..., prefix=..., map_location=...)`` loads through the family's
      converter (``_convert``, official / timm / mmdet layouts) with an exact report of unplaced keys; a dict with a
      ``checkpoint`` and no ``type`` means the same (mmdet's PVT reads its ``init_cfg`` so).
    * any other ``init_cfg`` goes to mmengine; with none, :meth:`_init_default` (at build and in ``init_weights``).

    A family sets the class attributes below and implements ``_frozen`` (what ``frozen_stages`` freezes).
    """

    arch_zoo: Dict[str, dict] = {}  # preset name -> arch dict
    arch_keys: Tuple[str, ...] = ()  # the keys an arch dict must have
    arch_options: Tuple[str, ...] = ()  # the keys it may add (what some presets set: kernels, windows)
    conv_init: Optional[str] = None  # 'fan_out': convs normal(0, sqrt(2 / fan_out)), zero bias (PVT); None: torch's
    trunc_normal_params: Tuple[str, ...] = ()  # positions / tokens drawn trunc-normal(0.02) after the layers, in order
    stem: Tuple[str, ...] = ()  # parameter-name starts at layer depth 0
    with_cp = False
    frozen_stages = -1
    norm_eval = False  # BatchNorms stay in eval mode (frozen statistics) while the backbone trains
    _convert: Optional[Callable] = None  # the family's convert function (a staticmethod in subclasses)
    _prefer_ema = False  # Pretrained files holding EMA weights: load those (SOFT's releases are evaluated with them)
    # (what, key regex) pairs: keys a start checkpoint and this model do not share by design (a classifier's head
    # parts in a dense model, an adapter new to it); loading names them in one note each instead of warning
    by_design_keys: Tuple[Tuple[str, str], ...] = ()
    family: Optional[Family] = None  # what the tools read, on each family's class (register_family)

    def __init__(self, init_cfg=None, pretrained: Optional[str] = None, with_cp: bool = False,
                 norm_eval: bool = False):
        init_cfg = resolve_pretrained(type(self).__name__, pretrained, init_cfg)
        if isinstance(init_cfg, dict) and 'type' not in init_cfg and 'checkpoint' in init_cfg:
            init_cfg = dict(init_cfg, type='Pretrained')
        super().__init__(init_cfg=init_cfg)
        self.with_cp = with_cp
        self.norm_eval = norm_eval

    @property
    def owner(self) -> str:
        return type(self).__name__

    # ------------------------------------------------------------------ argument checks
    def resolve_arch(self, arch) -> dict:
        """A copy of the preset ``arch`` names, or of the arch dict itself (``arch_keys``, optionally
        ``arch_options``)."""
        keys = ', '.join(self.arch_keys)
        if isinstance(arch, str):
            if arch not in self.arch_zoo:
                raise ValueError(f'{self.owner}: unknown arch {arch!r}; valid archs: {", ".join(self.arch_zoo)} '
                                 f'(or a dict with {keys})')
            return dict(self.arch_zoo[arch])
        if isinstance(arch, dict):
            if not set(self.arch_keys) <= set(arch) <= {*self.arch_keys, *self.arch_options}:
                may = f' and may add {", ".join(self.arch_options)}' if self.arch_options else ''
                raise ValueError(f'{self.owner}: an arch dict needs the keys {keys}{may}; got {sorted(arch)}')
            return dict(arch)
        raise TypeError(f'{self.owner}: arch must be a name ({", ".join(self.arch_zoo)}) or a dict with {keys}, '
                        f'got {arch!r}')

    def check_out_indices(self, out_indices, num: int, unit: str = 'stage', count: Optional[int] = None) -> tuple:
        """``out_indices`` (an index or a sequence) as indices in [0, num - 1]; a negative one counts from the end,
        as in mmpretrain. ``count``: exactly that many, increasing (XCiT's four blocks)."""
        given = (out_indices,) if isinstance(out_indices, numbers.Integral) else tuple(out_indices)
        ok = bool(given) and all(isinstance(i, numbers.Integral) and not isinstance(i, bool) and -num <= i < num
                                 for i in given)
        out = tuple(int(i) % num for i in given) if ok else ()
        if ok and count is not None:
            ok = len(out) == count and list(out) == sorted(set(out))
        if not ok:
            what = f'{"four" if count == 4 else count} increasing {unit}' if count else unit
            raise ValueError(f'{self.owner}: out_indices must be {what} indices in [0, {num - 1}], got {given!r}; '
                             f'a negative index counts from the end ({-num}..-1)')
        return out

    def check_frozen_stages(self, frozen_stages, num: int) -> int:
        if not isinstance(frozen_stages, numbers.Integral) or isinstance(frozen_stages, bool) or \
                not -1 <= frozen_stages <= num:
            raise ValueError(f'{self.owner}: frozen_stages must be an int in [-1, {num}], got {frozen_stages!r}')
        return int(frozen_stages)

    # ------------------------------------------------------------------ initialisation
    def _init_default(self):
        """trunc-normal(0.02) Linear weights, zero biases, unit LayerNorms, relative position bias tables
        trunc-normal(0.02), convs as ``conv_init``; then ``trunc_normal_params``. Kernels keep their own."""
        owned = kernel_owned(self)
        for m in self.modules():
            if id(m) in owned:
                continue
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d) and self.conv_init == 'fan_out':
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                nn.init.normal_(m.weight, 0, (2.0 / fan_out) ** 0.5)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif getattr(m, 'relative_position_bias_table', None) is not None:
                trunc_normal_(m.relative_position_bias_table, std=0.02)
        for name in self.trunc_normal_params:
            for m in self.modules():
                if id(m) not in owned and m._parameters.get(name) is not None:
                    trunc_normal_(m._parameters[name], std=0.02)

    def _load_converter(self) -> Optional[Callable]:
        """The function ``Pretrained`` converts a file with: the family's ``_convert`` (a subclass may narrow what it
        places for the mode it is built in)."""
        return type(self)._convert

    def init_weights(self):
        if init_from_cfg(self, self._load_converter(), prefer_ema=self._prefer_ema) == 'loaded':
            return
        if self.init_cfg is None:
            self._init_default()
        super().init_weights()

    # ------------------------------------------------------------------ freezing
    def _frozen(self) -> List[object]:
        """The modules (and loose parameters) ``frozen_stages`` freezes."""
        return []

    def _freeze_stages(self):
        for m in self._frozen():
            if isinstance(m, nn.Parameter):
                m.requires_grad = False
                continue
            m.eval()
            for p in m.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    # ------------------------------------------------------------------ layer depths
    def _layer_count(self) -> int:
        return sum(self.depths)

    def _stage_part_layer(self, i: int, part: str) -> int:
        """The depth of ``stages.{i}.{part}`` other than its blocks: just before the stage's first block."""
        return sum(self.depths[:i])

    def _layer_id(self, name: str) -> Optional[int]:
        """The depth of parameter ``name`` (None: the last): the stem 0, block j of stage i sum(depths[:i]) + j + 1."""
        if self.stem and name.startswith(self.stem):
            return 0
        if name.startswith('stages.'):
            p = name.split('.')
            i = int(p[1])
            if p[2] == 'blocks':
                return sum(self.depths[:i]) + int(p[3]) + 1
            return self._stage_part_layer(i, p[2])
        return None

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """(layer_id, max_layer_id) as mmpretrain's backbones give them to its layer-wise lr decay; parameters
        outside ``prefix`` (neck, head) and the output norms get the last id."""
        num_layers = self._layer_count() + 2
        layer = self._layer_id(param_name[len(prefix):]) if param_name.startswith(prefix) else None
        return (num_layers - 1 if layer is None else layer), num_layers


class StagedBackbone(SoftFreeBackbone):
    """What SoftFreeSwin and SoftFreeCSWin share: (B, H, W, C) stages, each opening with its downsampling (none in
    stage 0), a LayerNorm ``norm{i}`` per output, stage freezing. Subclasses build ``patch_embed``, ``stages``
    (each with ``downsample``) and ``drop_after_pos``, after :meth:`_stages_from`."""

    # freezing stage i also freezes the downsampling that follows it (stages[i + 1].downsample), as mmdet's,
    # mmpretrain's and the official Swin, whose stage i ends with its patch merging
    freeze_next_downsample = False
    stem = ('patch_embed',)

    def _stages_from(self, arch, depths: Sequence[int], num_heads: Sequence[int], embed_dims: int, out_indices,
                     frozen_stages) -> Tuple[int, ...]:
        """Check and record the stage layout (channels doubling per stage); returns the stage channels."""
        self.arch = arch
        self.depths = tuple(depths)
        self.num_heads = tuple(num_heads)
        num = len(self.depths)
        self.out_indices = self.check_out_indices(out_indices, num)
        self.frozen_stages = self.check_frozen_stages(frozen_stages, num)
        dims = tuple(embed_dims * 2 ** i for i in range(num))
        self.embed_dims = self.num_features = dims
        self.out_channels = tuple(dims[i] for i in self.out_indices)
        return dims

    def _add_out_norms(self, dims):
        for i in self.out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(dims[i]))

    @property
    def feature_pyramid(self) -> bool:
        """True when the model gives more than its last stage (a detection / segmentation backbone)."""
        return tuple(self.out_indices) != (len(self.depths) - 1,)

    def _load_converter(self):
        """A classifier release's final ``norm`` becomes the last output norm of a classifier (the only output, the
        classifier's own place for it); in a feature pyramid it is not placed and ``norm{last}`` keeps its
        initialisation, as the official Swin / CSWin / Agent detection and segmentation code and mmdet's
        SwinTransformer leave it (their per-output norms share no name with it)."""
        convert = type(self)._convert
        if convert is None or not self.feature_pyramid:
            return convert

        def without_final_norm(sd):
            return convert(OrderedDict((k, v) for k, v in sd.items() if not k.startswith('norm.')))
        return without_final_norm

    @property
    def by_design_keys(self):
        if not self.feature_pyramid:
            return ()
        last = len(self.depths) - 1
        return (("of the output norms, new to a feature pyramid: a classifier's final norm is not placed in "
                 f'norm{last} (the official detection / segmentation code and mmdet leave it at its initialisation)',
                 r'^norm\d+\.'),)

    def _frozen(self):
        if self.frozen_stages < 0:
            return []
        frozen = [self.patch_embed]
        for i in range(self.frozen_stages):
            frozen.append(self.stages[i])
            if self.freeze_next_downsample and i + 1 < len(self.stages) and self.stages[i + 1].downsample is not None:
                frozen.append(self.stages[i + 1].downsample)
            if i in self.out_indices:
                frozen.append(getattr(self, f'norm{i}'))
        return frozen

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """The (B, H, W, C) tokens before the first stage; a subclass adds what follows the patch embedding there."""
        return self.patch_embed(x)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if x.dim() != 4:
            raise ValueError(f'{self.owner}: expected images (B, C, H, W), got shape {tuple(x.shape)}')
        x = self.drop_after_pos(self._embed(x))
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.out_indices:
                outs.append(getattr(self, f'norm{i}')(x).permute(0, 3, 1, 2).contiguous())
        return tuple(outs)
