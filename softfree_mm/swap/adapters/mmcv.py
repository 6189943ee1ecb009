"""mmcv: the ``MultiheadAttention`` of DETR-family transformer layers (self- and cross-attention, attention and
key-padding masks), around a torch MultiheadAttention."""
import warnings

from ..adapter import Layout, need, register
from ..layouts import torch_mha_attend, torch_mha_check


def _mha_layout(m, path, model):
    need(m, 'attn', 'proj_drop', 'dropout_layer', 'batch_first', 'num_heads', 'embed_dims')
    torch_mha_check(m.attn)
    lay = Layout(num_heads=m.num_heads, head_dim=m.attn.head_dim, nq=5, nk=5, scale=m.attn.head_dim ** -0.5,
                 no_grid='mmcv MultiheadAttention receives token sequences without an (H, W) grid',
                 masks='mmcv MultiheadAttention is handed attention / key-padding masks (DETR-family layers pass '
                       'the padding mask of batched images)',
                 varying='the number of keys follows the image size')
    if 'cross' in path.rpartition('.')[2]:
        lay.nk = 7
        lay.cross = 'in cross-attention the keys come from another sequence (the memory), not from the queries'
        lay.where = 'cross-attention (queries x memory)'
    else:
        lay.where = 'sequence attention'
    return lay


def _mha_forward(self, query, key=None, value=None, identity=None, query_pos=None, key_pos=None, attn_mask=None,
                 key_padding_mask=None, **kwargs):
    # the signature and the data flow are mmcv's MultiheadAttention.forward (whose **kwargs pass extra layer
    # arguments through unused); the attention itself goes through the kernel
    if 'residual' in kwargs:  # mmcv's deprecated name for identity
        warnings.warn("'residual' is deprecated in MultiheadAttention, use 'identity'", DeprecationWarning)
        identity = kwargs.pop('residual')
    if key is None:
        key = query
    if value is None:
        value = key
    if identity is None:
        identity = query
    if key_pos is None and query_pos is not None:
        if query_pos.shape == key.shape:
            key_pos = query_pos
        else:
            warnings.warn(f'position encoding of key is missing in {type(self).__name__}.')
    if query_pos is not None:
        query = query + query_pos
    if key_pos is not None:
        key = key + key_pos
    if not self.batch_first:
        query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    out = torch_mha_attend(self, self.attn, query, key, value, attn_mask, key_padding_mask)
    if not self.batch_first:
        out = out.transpose(0, 1)
    return identity + self.dropout_layer(self.proj_drop(out))


register('mmcv MultiheadAttention (DETR-family layers)', ['mmcv.cnn.bricks.transformer.MultiheadAttention'],
         _mha_layout, _mha_forward)
