"""mmdet and mmseg: Swin's ``WindowMSA`` (the OpenMMLab W-MSA layout) and PVT's spatial-reduction attention (mmdet's
``SpatialReductionAttention``, mmseg's SegFormer ``EfficientMultiheadAttention``), both around a torch
MultiheadAttention."""
from ..adapter import SwapError, need, register
from ..attend import context, mix
from ..layouts import (MM_WINDOW_LABEL, mm_window_forward, mm_window_layout, sra_layout, torch_mha_attend,
                       torch_mha_check, torch_mha_out, torch_mha_qkv)

register(MM_WINDOW_LABEL, ['mmdet.models.backbones.swin.WindowMSA', 'mmseg.models.backbones.swin.WindowMSA'],
         mm_window_layout, mm_window_forward)


def _sra_layout(m, path, model):
    need(m, 'attn', 'proj_drop', 'dropout_layer', 'batch_first', 'num_heads', 'sr_ratio')
    torch_mha_check(m.attn)
    if 'forward' in vars(m):
        raise SwapError('unknown layout: the instance replaces its forward (legacy mmcv < 1.3.17 path)')
    return sra_layout(m.num_heads, m.attn.head_dim, m.attn.head_dim ** -0.5, m.sr_ratio, False)


def _sra_forward(self, x, hw_shape, identity=None):
    x_q = x
    if self.sr_ratio > 1:
        b, n, c = x.shape
        x_kv = self.sr(x.transpose(1, 2).reshape(b, c, *hw_shape))
        x_kv = self.norm(x_kv.flatten(2).transpose(1, 2))
    else:
        x_kv = x
    if identity is None:
        identity = x_q
    if self.kernel.needs_hw:  # only reached without spatial reduction: queries and keys share the grid
        q, k, v = torch_mha_qkv(self.attn, x_q, x_kv, x_kv)
        out = mix(self.kernel, q, k, v, (int(hw_shape[0]), int(hw_shape[1])), self.attn.head_dim ** -0.5, None,
                  None, float(self.attn.dropout), self.training, context(self.kernel, x_q, q.shape[1], q.shape[3]))
        out = torch_mha_out(self.attn, out)
    else:
        out = torch_mha_attend(self, self.attn, x_q, x_kv, x_kv, None, None)
    return identity + self.dropout_layer(self.proj_drop(out))


register('OpenMMLab PVT spatial-reduction attention',
         ['mmdet.models.backbones.pvt.SpatialReductionAttention',
          'mmseg.models.backbones.mit.EfficientMultiheadAttention'], _sra_layout, _sra_forward)
