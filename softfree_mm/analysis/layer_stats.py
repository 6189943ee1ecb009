"""Per attention layer of a trained model, at several input sizes: what the kernel sees and gives (the framework's
measure of a kernel that is not invariant in its token count N, such as x^3 / sqrt(N), when a model trained at one
size runs at another). For one call: the real query rows N and keys per row, ||A||_F and the score Jacobian's norm
over sqrt(N) (softmax bounds them by 1 and 2; AttentionStatsHook's measures, ``matrix_norms``), the RMS of the scores
``scale q.k`` over the pairs a row may see, of v and of the kernel's output, and the output's gain over v; and
where the layer sits in a block with a residual stream (the nearest enclosing module that is an item of a list, such
as ``stages.2.blocks.1``), the RMS of that stream (the block's input), of the attention branch the block adds to it
(the output of the block's child that holds the kernel, after its output projection and before a layer scale such
as XCiT's gamma) and their ratio: whether the branch swamps the stream.
"""
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..attention.base import default_scale
from ..engine.hooks.matrix_norms import NoScoreMap, JacobianSkipped, call_stats, keep_of

FIELDS = ('size', 'image', 'layer', 'rows', 'keys', 'fro_sqrt_n', 'jac_sqrt_n', 'score_rms', 'v_rms', 'out_rms',
          'gain', 'stream_rms', 'branch_rms', 'branch_ratio', 'note')


def _rms(x: torch.Tensor) -> float:
    return float(x.float().pow(2).mean().sqrt())


def call_layer_stats(call, jacobian: bool = True) -> Dict[str, object]:
    """The measures of one captured call (means over its heads and attention problems)."""
    q, k, v = call.q.float(), call.k.float(), call.v.float()
    out = dict(rows=None, keys=None, fro_sqrt_n=None, jac_sqrt_n=None, note='')
    try:
        st = call_stats(call, jacobian=jacobian)
    except (NoScoreMap, JacobianSkipped, ValueError) as e:  # no explicit matrix for this kernel
        out['note'] = str(e)
    else:
        n = max(st['rows'], 1.0)
        out.update(rows=st['rows'], keys=st['keys'], fro_sqrt_n=float(st['fro'].mean()) / n ** 0.5,
                   jac_sqrt_n=None if st['jac'] is None else float(st['jac'].mean()) / n ** 0.5,
                   note=st.get('jac_note', ''))
    scale = default_scale(call.scale, q.shape[-1], q)
    s = (q * scale) @ k.transpose(-2, -1) if not isinstance(scale, torch.Tensor) else (q * scale.float()) @ \
        k.transpose(-2, -1)
    keep = keep_of(call.mask, q, k).expand_as(s) if call.mask is not None else None
    out['score_rms'] = float(((s * s * keep).sum() / keep.sum().clamp_min(1)).sqrt()) if keep is not None else _rms(s)
    kwargs = dict(hw=call.hw, scale=call.scale, bias=call.bias, mask=call.mask)
    if call.context is not None:
        kwargs['context'] = call.context
    with torch.no_grad():
        o = call.kernel(call.q, call.k, call.v, **kwargs)
    out['v_rms'], out['out_rms'] = _rms(v), _rms(o)
    out['gain'] = out['out_rms'] / max(out['v_rms'], 1e-30)
    return out


def resized(data: dict, size: int) -> dict:
    """The preprocessed batch with its images resized to size x size (0: as they are)."""
    if not size:
        return data
    x = data['inputs']
    x = torch.stack(list(x)) if isinstance(x, (list, tuple)) else x
    return dict(data, inputs=F.interpolate(x.float(), size=(size, size), mode='bilinear', align_corners=False))


def block_and_branch(layer: str) -> Optional[tuple]:
    """(the block, the branch) of an attention layer's path: the nearest enclosing list item ('stages.2.blocks.1')
    and its child on the way to the layer ('stages.2.blocks.1.attn'); None where no list item encloses it."""
    parts = layer.split('.')
    items = [i for i, p in enumerate(parts[:-1]) if p.isdigit()]
    return ('.'.join(parts[:items[-1] + 1]), '.'.join(parts[:items[-1] + 2])) if items else None


class StreamScale:
    """Forward hooks recording, per attention layer, the RMS of its block's input (the residual stream) and of the
    branch's output; a branch whose module has no forward of its own (a list of them) records nothing."""

    def __init__(self, backbone, layers: Sequence[str], prefix: str = ''):
        self.seen: Dict[str, Dict[str, float]] = {}
        self._handles = []
        for layer in layers:
            where = block_and_branch(layer[len(prefix):] if layer.startswith(prefix) else layer)
            if where is None:
                continue
            block, branch = (backbone.get_submodule(w) for w in where)
            self._handles.append(block.register_forward_pre_hook(self._note(layer, 'stream_rms', first_arg=True)))
            self._handles.append(branch.register_forward_hook(self._note(layer, 'branch_rms')))

    def _note(self, layer: str, what: str, first_arg: bool = False):
        def hook(module, args, *out):
            x = args[0] if first_arg else out[0]
            x = x[0] if isinstance(x, (tuple, list)) else x
            if isinstance(x, torch.Tensor):
                self.seen.setdefault(layer, {})[what] = _rms(x)
        return hook

    def of(self, layer: str) -> Dict[str, Optional[float]]:
        got = self.seen.get(layer, {})
        stream, branch = got.get('stream_rms'), got.get('branch_rms')
        ratio = branch / stream if stream and branch is not None else None
        return dict(stream_rms=stream, branch_rms=branch, branch_ratio=ratio)

    def close(self):
        for h in self._handles:
            h.remove()


def layer_stats(model, samples, sizes: Sequence[int], layers: Optional[List[str]] = None,
                jacobian: bool = True) -> List[dict]:
    """Rows of FIELDS: every (size, image, layer)."""
    from mmengine.dataset import pseudo_collate

    from ..engine.hooks import AttentionCapture
    backbone = getattr(model, 'backbone', model)
    prefix = 'backbone.' if backbone is not model else ''
    rows = []
    for name, sample in samples:
        data = model.data_preprocessor(pseudo_collate([sample]), False)
        for size in sizes:
            with AttentionCapture(backbone, layers=layers, prefix=prefix) as cap:
                stream = StreamScale(backbone, [n for n, _ in cap.layers], prefix)
                try:
                    with torch.no_grad():
                        backbone(resized(data, size)['inputs'])
                finally:
                    stream.close()
            for layer, call in cap.calls.items():
                rows.append(dict(size=size or 'as fed', image=name, layer=layer, **call_layer_stats(call, jacobian),
                                 **stream.of(layer)))
    return rows


def summarise(rows: List[dict]) -> List[dict]:
    """Mean over images per (size, layer), in the rows' order."""
    groups: Dict[tuple, List[dict]] = {}
    for r in rows:
        groups.setdefault((r['size'], r['layer']), []).append(r)
    out = []
    for (size, layer), rs in groups.items():
        row = dict(size=size, layer=layer, images=len(rs))
        for key in FIELDS[3:-1]:
            vals = [r[key] for r in rs if r[key] is not None]
            row[key] = sum(vals) / len(vals) if vals else None
        out.append(row)
    return out
