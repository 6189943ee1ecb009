"""Attention transfer: a softmax-free backbone started from a softmax backbone's released weights, block by block.

The teacher is the backbone with softmax and the release's weights (frozen, always in eval mode); the student is
the same backbone with the new kernel (its own layout options may differ: Swin's global windows, PVT without spatial
reduction), starting from the teacher's weights, and only the kernel's own parameters plus the chosen groups train.
Each step runs the teacher on the images and records every block's input and output (:class:`AttentionBlock`:
x -> x + attention -> x + MLP); the student then runs with each block given its twin's recorded input in place of its
own, so the blocks learn independently and no block's error reaches the next, and nothing of size N x N is kept. The loss of block l is
``mean((student_l(x_l) - teacher_l(x_l))^2) / mean((teacher_l(x_l) - passthrough_l(x_l))^2)``: the error relative to
what the teacher's block adds to its stream (``passthrough`` is what the block returns when its branches add nothing:
``x_l`` for a pre-norm block, the norms of ``x_l`` for a post-norm one such as SOFT's), so that no layer dominates by
its scale. Blocks that compute what the teacher's do (the teacher's kernel in the teacher's layout, e.g. the softmax
last stage of the SOFT and InLine set-ups) are left out of the loss and of what trains. Images only: labels are not
read.

The block contract it relies on is checked when it is built (``block_contract.py``), on a small image through the
teacher: every block runs in the teacher's forward, is called with its tokens as the first positional argument and
returns one tensor shaped as them; a block that breaks it is one error naming the block and the family. The checkpoint
holds the student as ``backbone.*`` (the teacher is the release file, not saved), which the detection and segmentation
configs load with ``prefix='backbone.'`` and the fine-tuning classifier with the same.
"""
import re
from typing import Dict, List, Optional, Sequence

import torch
from mmengine.logging import MessageHub, print_log
from mmengine.model import BaseModel
from torch import nn

from ..attention import AttentionKernel
from .attention import KernelAttention
from .backbones.base import AttentionBlock
from .block_contract import check_blocks

GROUPS = ('kernel', 'qkv', 'proj', 'blocks')
# stage 1's losses: every one matches blocks; '+final' adds the student's own end-to-end output against the teacher's
# (final-feature distillation: per-block errors accumulate over the layers), '+attn' the attention weights of sampled
# query rows against the teacher's (Hedgehog's target, for kernels that declare a score map)
LOSSES = ('blocks', 'blocks+final', 'blocks+attn')
_INPUTS = re.compile(r'(^|\.)(qkv|q|k|v|kv)\.[^.]+$')
_PROJ = re.compile(r'(^|\.)proj\.[^.]+$')


def blocks_of(backbone: nn.Module) -> List[tuple]:
    """(path, block) of every :class:`AttentionBlock` of ``backbone``, in module order."""
    return [(name, m) for name, m in backbone.named_modules() if isinstance(m, AttentionBlock)]


def parameter_groups(block: nn.Module) -> Dict[str, List[str]]:
    """The names (within ``block``) of its parameters in each of :data:`GROUPS`: ``kernel``, the kernels' own
    (InLine's residual, SOFT's landmark convolutions); ``qkv``, the input projections (and what an attention layer
    holds itself, such as XCA's temperature); ``proj``, the output projection; ``blocks``, every parameter."""
    kernels = {name for name, m in block.named_modules() if isinstance(m, AttentionKernel)}
    layers = {name for name, m in block.named_modules() if isinstance(m, KernelAttention)}
    out = {g: [] for g in GROUPS}
    for name, _ in block.named_parameters():
        owner = name.rsplit('.', 1)[0] if '.' in name else ''
        out['blocks'].append(name)
        if any(name.startswith(k + '.') for k in kernels):
            out['kernel'].append(name)
        elif _INPUTS.search(name) or owner in layers:
            out['qkv'].append(name)
        elif _PROJ.search(name):
            out['proj'].append(name)
    return out


def training_step() -> int:
    """The current training iteration as mmengine's runner posts it ('iter' in the message hub); 0 outside one."""
    return int(MessageHub.get_current_instance().get_info('iter', 0) or 0)


def attention_rows(n: int, count: int, step: int) -> torch.Tensor:
    """``min(count, n)`` distinct query rows of ``n``, drawn for training step ``step`` with a generator of their
    own: other rows at every step, the same ones for the same step (a resumed run draws what the uninterrupted one
    drew), and the global random streams stay as they are."""
    gen = torch.Generator(device='cpu').manual_seed(1_000_003 * n + step)
    return torch.randperm(n, generator=gen)[:count]


class AttentionTransfer(BaseModel):
    """Stage 1 of the warm start: ``tools/train.py configs/transfer_{backbone}_{attention}.py``.

    Args:
        backbone: the student (the kernel's classification config's backbone; its init is replaced by the
            teacher's weights).
        teacher: the softmax backbone with ``init_cfg=dict(type='Pretrained', checkpoint=<the release>)``; the
            same family and architecture as the student (depths, widths, heads).
        train: the groups of :func:`parameter_groups` that train: ``kernel`` (always), ``qkv``, ``proj``, ``blocks``
            (every block parameter); what the teacher has no value for trains in any case.
        neck, head, train_cfg: the classification config's (a transfer config inherits it for the student's backbone
            and the data); not built or used: stage 1 reads no labels.
        probe_size: side of the image the block contract is checked on at build (and blocks identical to the
            teacher's found).
        loss: ``blocks`` (each block's output, the default), ``blocks+final`` (and, weighted by ``extra_weight``, the
            student's end-to-end output against the teacher's), ``blocks+attn`` (and the attention weights of
            ``attn_rows`` sampled query rows per head against the teacher's: only for kernels that declare a score
            map; at most rows x tokens weights per head are formed, never N x N).
    """

    def __init__(self, backbone: dict, teacher: dict, train: Sequence[str] = ('kernel', 'qkv'),
                 neck: Optional[dict] = None, head: Optional[dict] = None, train_cfg: Optional[dict] = None,
                 data_preprocessor: Optional[dict] = None, init_cfg=None, eps: float = 1e-8, probe_size: int = 64,
                 loss: str = 'blocks', extra_weight: float = 1.0, attn_rows: int = 64):
        if isinstance(data_preprocessor, dict) and 'type' not in data_preprocessor:
            # a classification config's preprocessor settings (mmpretrain's ImageClassifier adds the same type)
            data_preprocessor = dict(data_preprocessor, type='mmpretrain.ClsDataPreprocessor')
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        train = (train, ) if isinstance(train, str) else tuple(train)
        bad = [g for g in train if g not in GROUPS]
        if bad or not train:
            raise ValueError(f'AttentionTransfer: train must name groups of {list(GROUPS)}, got {list(train)!r}')
        self.train_groups = tuple(dict.fromkeys(('kernel', *train)))
        self.eps = eps
        if loss not in LOSSES:
            raise ValueError(f'AttentionTransfer: loss must be one of {list(LOSSES)}, got {loss!r}')
        if not (isinstance(attn_rows, int) and attn_rows >= 1) or not extra_weight >= 0:
            raise ValueError(f'AttentionTransfer: attn_rows must be a positive int and extra_weight >= 0, got '
                             f'{attn_rows!r}, {extra_weight!r}')
        self.loss_kind, self.extra_weight, self.attn_rows = loss, float(extra_weight), attn_rows
        from mmengine.registry import MODELS, DefaultScope

        # mmengine's root registry in the package's scope finds our backbones, whatever scope builds this (as
        # swap/ does; importing softfree_mm.registry from here would be a circle through models/)
        with DefaultScope.overwrite_default_scope('softfree_mm'):
            self.teacher = MODELS.build(teacher)
            self.backbone = MODELS.build(backbone)
        self._check_twins()
        self.teacher.requires_grad_(False)
        self.teacher.eval()
        self.same = check_blocks(self.teacher, blocks_of(self.teacher), blocks_of(self.backbone), probe_size)
        if loss == 'blocks+attn':
            self._check_score_maps()
        for m in self.backbone.modules():  # the student stays in eval mode (train()): with_cp still holds
            if getattr(m, 'with_cp', False):
                m.checkpoint_in_eval = True
        self._freeze_student()
        self._register_state_dict_hook(_drop_teacher)
        self._register_load_state_dict_pre_hook(self._teacher_from_itself, with_module=False)

    # ------------------------------------------------------------------ structure
    def _check_twins(self):
        """The student is the teacher's twin: same family, same blocks, same architecture."""
        t, s = self.teacher, self.backbone
        if type(t) is not type(s):
            raise ValueError(f'AttentionTransfer: the student backbone is a {type(s).__name__}, the teacher a '
                             f'{type(t).__name__}: both must be the same family')
        tb, sb = [n for n, _ in blocks_of(t)], [n for n, _ in blocks_of(s)]
        if not tb:
            raise ValueError(f'AttentionTransfer: {type(t).__name__} has no AttentionBlock to transfer')
        if tb != sb:
            raise ValueError(f'AttentionTransfer: the student {type(s).__name__} has {len(sb)} attention blocks, the '
                             f'teacher {len(tb)}: they must have the same depths (first difference: '
                             f'{next((a, b) for a, b in zip(tb + [None], sb + [None]) if a != b)})')
        from .converters import structure_differences
        rows = structure_differences(s, t)
        if rows:
            raise ValueError(f'AttentionTransfer: the student {type(s).__name__} has another architecture than the '
                             f'teacher (student against teacher): ' + '; '.join(rows))

    def _check_score_maps(self):
        """Attention-weight matching needs both kernels' weights as a function of per-pair scores: a student kernel
        that declares none is refused by name."""
        for i, (path, block) in enumerate(blocks_of(self.backbone)):
            if i in self.same:
                continue
            for name, k in block.named_modules():
                if isinstance(k, AttentionKernel) and (k.no_score_map or
                                                       type(k)._score_map is AttentionKernel._score_map):
                    why = k.no_score_map or 'it declares no score map'
                    raise ValueError(f"AttentionTransfer: loss='blocks+attn' matches attention weights, but the "
                                     f"kernel '{k.name}' of {path} has none of a per-pair score map ({why}); use "
                                     "loss='blocks' or 'blocks+final'")

    def _freeze_student(self):
        """Train the chosen groups and every student parameter the teacher has no value for (what the kernel or
        layout change adds: InLine's residual, SOFT's landmark convolutions, a CSWin global branch's LePE)."""
        own, src = self.backbone.state_dict(), self.teacher.state_dict()
        self.new = [k for k in own if k not in src or src[k].shape != own[k].shape]
        self.backbone.requires_grad_(False)
        params = dict(self.backbone.named_parameters())
        blocks = blocks_of(self.backbone)
        if len(self.same) == len(blocks):
            raise ValueError('AttentionTransfer: nothing to transfer: every block of the student computes what the '
                             "teacher's does (the teacher's kernel in the teacher's layout)")
        frozen = tuple(f'{blocks[i][0]}.' for i in sorted(self.same))  # the teacher's blocks: nothing to learn
        self.trained = [k for k in self.new if k in params and not k.startswith(frozen)]
        for i, (path, block) in enumerate(blocks):
            if i in self.same:
                continue
            groups = parameter_groups(block)
            for g in self.train_groups:
                self.trained += [f'{path}.{name}' for name in groups[g]]
        self.trained = list(dict.fromkeys(self.trained))
        if not self.trained:
            raise ValueError(f'AttentionTransfer: nothing would train: the student\'s kernels have no parameters of '
                             f'their own and train={list(self.train_groups)} selects none; add the input projections '
                             "('qkv'), the output projection ('proj') or 'blocks'")
        for name in self.trained:
            params[name].requires_grad_(True)

    def train(self, mode: bool = True):
        """Teacher and student stay in eval mode: the student's blocks must compute what the teacher's do (no drop
        path or dropout, BatchNorm with the release's statistics); its parameters still get their gradients."""
        super().train(mode)
        self.teacher.eval()
        self.backbone.eval()
        return self

    def init_weights(self):
        """The teacher loads its release; the student starts from the teacher's weights (what the teacher has no value
        for keeps its own initialisation, and trains)."""
        super().init_weights()
        own = self.backbone.state_dict()
        src = {k: v for k, v in self.teacher.state_dict().items() if k in own and v.shape == own[k].shape}
        self.backbone.load_state_dict(src, strict=False)
        new = self.new
        extra = [k for k in self.teacher.state_dict() if k not in own]
        print_log(f'AttentionTransfer: the student starts from the teacher\'s weights: {len(src)} of its {len(own)} '
                  f'placed; new to its kernels or layout (their own initialisation): {len(new)} {new[:6]}'
                  f'{"..." if len(new) > 6 else ""}; the teacher\'s, not in the student: {len(extra)} {extra[:6]}'
                  f'{"..." if len(extra) > 6 else ""}; training {len(self.trained)} tensors '
                  f'({", ".join(self.train_groups)})', logger='current')

    def _teacher_from_itself(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                             error_msgs):
        # checkpoints leave the teacher out (it is the release file): strict loading gets its current tensors
        for k, v in self.teacher.state_dict(keep_vars=True).items():
            state_dict.setdefault(f'{prefix}teacher.{k}', v.detach())

    # ------------------------------------------------------------------ the loss
    def transfer_losses(self, images: torch.Tensor, every_block: bool = False) -> Dict[str, torch.Tensor]:
        """``loss_transfer`` (the mean over the blocks that train) and ``block_<i>`` (each one's, detached) for a batch;
        ``every_block``: also the blocks identical to the teacher's (computed, reported, not in the mean).

        The teacher's blocks record their input and output; then the student runs, each of its blocks given its
        twin's recorded input in place of its own (the layout arguments, such as Swin's window geometry, stay the
        student's own: its stages compute them from the same grid); a block identical to its twin is not run (its
        output is the twin's), unless ``every_block``."""
        teacher = [b for _, b in blocks_of(self.teacher)]
        student = [b for _, b in blocks_of(self.backbone)]
        inputs, targets, outputs = {}, {}, {}
        skip = set() if every_block else self.same

        def record(i):
            def hook(module, args, kwargs, output):
                inputs[i], targets[i] = args[0].detach(), output.detach()
            return hook

        def keep(i):
            def hook(module, args, kwargs, output):
                outputs[i] = output
            return hook

        handles = [b.register_forward_hook(record(i), with_kwargs=True) for i, b in enumerate(teacher)]
        attn = self.loss_kind == 'blocks+attn'
        calls_t, calls_s = {}, {}
        if attn:
            handles += self._kernel_hooks(self.teacher, calls_t, skip)
        try:
            with torch.no_grad():
                final_t = self.teacher(images)
        finally:
            for h in handles:
                h.remove()
        handles = [b.register_forward_hook(keep(i), with_kwargs=True) for i, b in enumerate(student) if i not in skip]
        if attn:
            handles += self._kernel_hooks(self.backbone, calls_s, skip)
        # each block its twin's input; a block identical to its twin the twin's output (nothing run). They stay set
        # until the next step: a checkpointed block recomputed in the backward pass takes the same
        for i, b in enumerate(student):
            b._transfer_substitute = (None, targets[i]) if i in skip else (inputs[i], None)
        try:
            self.backbone(images)
        finally:
            for h in handles:
                h.remove()
        per_block = {}
        for i in sorted(outputs):
            target = targets[i].float()
            with torch.no_grad():
                base = teacher[i].passthrough(inputs[i]).float()
            err = (outputs[i].float() - target).pow(2).mean()
            per_block[i] = err / (target - base).pow(2).mean().clamp_min(self.eps)
        trained = [v for i, v in per_block.items() if i not in self.same]
        losses = {'loss_transfer': torch.stack(trained).mean()}
        losses.update({f'block_{i:02d}': v.detach() for i, v in per_block.items()})
        if self.loss_kind == 'blocks+final':
            losses['loss_final'] = self.extra_weight * _relative_error(self._end_to_end(images), final_t, self.eps)
        elif attn:
            errs = {key: self._attention_error(calls_s[key], calls_t[key]) for key in calls_s if key in calls_t}
            trained = [v for (i, _), v in errs.items() if i not in self.same]
            losses['loss_attn'] = self.extra_weight * torch.stack(trained).mean()
            for i in sorted({i for i, _ in errs}):
                losses[f'attn_{i:02d}'] = torch.stack([v for (j, _), v in errs.items() if j == i]).mean().detach()
        return losses

    def _end_to_end(self, images):
        """The student's own forward (no block substituted), not checkpointed: the substitutions of the block pass
        stay in place for its recomputation in the backward pass."""
        blocks = [b for _, b in blocks_of(self.backbone)]
        subs = [b.__dict__.pop('_transfer_substitute', None) for b in blocks]
        cp = [(m, m.checkpoint_in_eval) for m in self.backbone.modules() if hasattr(m, 'checkpoint_in_eval')]
        for m, _ in cp:
            m.checkpoint_in_eval = False
        try:
            return self.backbone(images)
        finally:
            for b, sub in zip(blocks, subs):
                if sub is not None:
                    b._transfer_substitute = sub
            for m, was in cp:
                m.checkpoint_in_eval = was

    def clear_substitutes(self):
        for _, b in blocks_of(self.backbone):
            b.__dict__.pop('_transfer_substitute', None)

    def _kernel_hooks(self, net, calls: dict, skip) -> list:
        """Forward hooks on the kernels of ``net``'s blocks (but ``skip``'s) that keep each call's q, k and the layout
        arguments, keyed by (block, kernel path)."""
        handles = []
        for i, (path, block) in enumerate(blocks_of(net)):
            if i in skip:
                continue
            for name, k in block.named_modules():
                if isinstance(k, AttentionKernel):
                    def hook(module, args, kwargs, output, key=(i, name)):
                        params = dict(zip(('q', 'k', 'v', 'hw', 'scale', 'bias', 'mask'), args), **kwargs)
                        calls[key] = (module, params)
                    handles.append(k.register_forward_hook(hook, with_kwargs=True))
        return handles

    def _attention_error(self, student, teacher) -> torch.Tensor:
        """Relative squared error of the student's attention weights against the teacher's on ``attn_rows``
        query rows per call, the same rows for both, drawn anew at each training step (``attention_rows``)."""
        (ks, ps), (kt, pt) = student, teacher
        n = pt['q'].shape[2]
        rows = attention_rows(n, self.attn_rows, training_step()).to(pt['q'].device)

        def weights(kernel, p, grad):
            # hw is the queries' grid: a strict sample of the rows has none, and a score map (the weights, not a
            # kernel's residual such as InLine's) does not read it
            cut = dict(scale=p.get('scale'), hw=p.get('hw') if len(rows) == n else None)
            for key in ('bias', 'mask'):  # per-query rows of a bias or mask follow the queries
                val = p.get(key)
                cut[key] = val.index_select(-2, rows) if torch.is_tensor(val) and val.dim() >= 2 and \
                    val.shape[-2] == n else val
            with torch.set_grad_enabled(grad):
                return kernel.score_map(p['q'].index_select(2, rows), p['k'], **cut).matrix().float()

        a_t = weights(kt, pt, False)
        a_s = weights(ks, ps, True)
        return (a_s - a_t).pow(2).mean() / a_t.pow(2).mean().clamp_min(self.eps)

    def forward(self, inputs: torch.Tensor, data_samples=None, mode: str = 'tensor'):
        if mode == 'loss':
            return self.transfer_losses(inputs)
        if mode == 'tensor':
            self.clear_substitutes()
            return self.backbone(inputs)
        raise ValueError(f"AttentionTransfer: mode must be 'loss' or 'tensor' (stage 1 has no predictions), got "
                         f'{mode!r}')


def _relative_error(out, target, eps) -> torch.Tensor:
    """Mean over the outputs (a backbone returns a tuple of maps) of mean((out - target)^2) / mean(target^2)."""
    outs = out if isinstance(out, (tuple, list)) else (out, )
    targets = target if isinstance(target, (tuple, list)) else (target, )
    return torch.stack([(o.float() - t.float()).pow(2).mean() / t.float().pow(2).mean().clamp_min(eps)
                        for o, t in zip(outs, targets)]).mean()


def _drop_teacher(module, state_dict, prefix, local_metadata):
    for k in [k for k in state_dict if k.startswith(prefix + 'teacher.')]:
        del state_dict[k]
    return state_dict
