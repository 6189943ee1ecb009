"""A detector starts from a classifier's checkpoint the ordinary OpenMMLab way, as `make demo` does.

A user who trained the classifier config (mmpretrain writes ``backbone.*``, ``head.*`` keys) points a config that
inherits our Mask R-CNN config at that file with
``model = dict(backbone=dict(init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')))``.
Guards: that child config merges without ``_delete_``; building the detector and initialising it puts exactly the
classifier's backbone tensors (weights and BN statistics) into the detector's backbone, every block included; only
the detection adapter is left to its own initialisation, and only the class-attention part of the classifier is not
placed (a prefix that matches no key is an error naming it).
"""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS

import softfree_mm  # noqa: F401
from softfree_mm.engine.device import _replace_syncbn

from tests.helpers import ROOT

TINY = dict(embed_dims=32, depth=4, num_heads=4)


def _build(cfg):
    _replace_syncbn(cfg.model)
    with MODELS.switch_scope_and_registry(cfg.default_scope) as registry:
        return registry.build(cfg.model)


@pytest.fixture(scope='module')
def classifier_checkpoint(tmp_path_factory):
    """A checkpoint of the demo classifier config (tiny width) in the layout mmengine's CheckpointHook writes."""
    from mmengine.runner import save_checkpoint
    cfg = Config.fromfile(osp.join(ROOT, 'configs', 'demo', 'cls_xcit_s12_poly3_demo.py'))
    cfg.model.backbone.update(TINY, cls_attn_layers=1)
    cfg.model.head.in_channels = TINY['embed_dims']
    torch.manual_seed(1)
    model = _build(cfg)
    model.init_weights()
    with torch.no_grad():  # trained-looking BN statistics, so buffers are checked too
        for name, buf in model.named_buffers():
            if name.endswith(('running_mean', 'running_var')):
                buf.uniform_(0.5, 1.5)
    path = str(tmp_path_factory.mktemp('cls') / 'epoch_2.pth')
    save_checkpoint({'meta': dict(epoch=2, iter=10), 'state_dict': model.state_dict()}, path)
    return path, {k[len('backbone.'):]: v for k, v in model.state_dict().items() if k.startswith('backbone.')}


def _user_config(tmp_path, ckpt, prefix='backbone.'):
    path = tmp_path / 'my_maskrcnn.py'
    path.write_text(f"""_base_ = {osp.join(ROOT, 'configs', 'maskrcnn_xcit_s12_poly3.py')!r}
model = dict(
    backbone=dict(init_cfg=dict(type='Pretrained', checkpoint={ckpt!r}, prefix={prefix!r}),
                  embed_dims={TINY['embed_dims']}, depth={TINY['depth']}, num_heads={TINY['num_heads']},
                  out_indices=(0, 1, 2, 3)),
    neck=dict(in_channels=[32, 32, 32, 32]))
""")
    return str(path)


def test_user_config_overriding_init_cfg_loads_the_classifier_backbone_into_the_detector(classifier_checkpoint,
                                                                                        tmp_path):
    ckpt, cls_backbone = classifier_checkpoint
    cfg = Config.fromfile(_user_config(tmp_path, ckpt))  # merges: no _delete_ needed
    init = cfg.model.backbone.init_cfg
    assert (init.type, init.checkpoint, init.prefix) == ('Pretrained', ckpt, 'backbone.')
    torch.manual_seed(2)
    det = _build(cfg)
    det_backbone = det.backbone.state_dict()
    shared = sorted(set(det_backbone) & set(cls_backbone))
    random_weights = [k for k in shared if k.endswith(('qkv.weight', 'fc1.weight', 'conv1.weight'))]
    assert len(random_weights) == 3 * TINY['depth']
    assert not any(torch.equal(det_backbone[k], cls_backbone[k]) for k in random_weights)
    det.init_weights()
    det_backbone = det.backbone.state_dict()
    for k in shared:
        assert torch.equal(det_backbone[k], cls_backbone[k]), k
    # every block and the stem came from the classifier; what was not placed is named, nothing else
    assert {k.split('.')[1] for k in shared if k.startswith('blocks.')} == {str(i) for i in range(TINY['depth'])}
    assert any(k.startswith('patch_embed.') and k.endswith('running_var') for k in shared)
    assert {k.split('.')[0] for k in set(det_backbone) - set(cls_backbone)} == {'fpn1', 'fpn2'}
    assert {k.split('.')[0] for k in set(cls_backbone) - set(det_backbone)} == {'cls_token', 'cls_attn_blocks',
                                                                                'norm'}


def test_pretrained_prefix_that_matches_no_key_is_an_error_naming_it(classifier_checkpoint, tmp_path):
    ckpt, _ = classifier_checkpoint
    cfg = Config.fromfile(_user_config(tmp_path, ckpt, prefix='encoder.'))
    _replace_syncbn(cfg.model)
    with MODELS.switch_scope_and_registry(cfg.default_scope) as registry:
        backbone = registry.build(cfg.model.backbone)
    with pytest.raises(ValueError, match="prefix 'encoder.'"):
        backbone.init_weights()
