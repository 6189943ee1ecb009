"""The demo configs at tiny widths (the demo tests and the mmcv-ops comparison share them), and one demo data root
per test session for the tool tests that only read it (the first tool run writes it, under a file lock; later runs
find it complete)."""
import os.path as osp

from tests.helpers import ROOT

DEMO = osp.join(ROOT, 'configs', 'demo')

# tiny widths for each demo config; everything else (data, pipelines, heads' structure, schedule type) is the demo's
TINY = {
    'maskrcnn': ('maskrcnn_xcit_s12_poly3_demo.py', """
model = dict(
    backbone=dict(embed_dims=32, depth=4, num_heads=4, out_indices=(0, 1, 2, 3), init_cfg=dict(type='Scratch')),
    neck=dict(in_channels=[32, 32, 32, 32], out_channels=32),
    rpn_head=dict(in_channels=32, feat_channels=32),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=32),
        bbox_head=dict(in_channels=32, fc_out_channels=64),
        mask_roi_extractor=dict(out_channels=32),
        mask_head=dict(in_channels=32, conv_out_channels=32)),
    train_cfg=dict(rpn_proposal=dict(max_per_img=64), rcnn=dict(sampler=dict(num=32))),
    test_cfg=dict(rpn=dict(max_per_img=64)))
"""),
    'upernet': ('upernet_swin_t_poly3_demo.py', """
model = dict(
    backbone=dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)),
    decode_head=dict(in_channels=[16, 32, 64, 128], channels=16),
    auxiliary_head=dict(in_channels=64, channels=8))
train_dataloader = dict(batch_size=2)
"""),
    'semfpn': ('semfpn_pvt_v2_b2_poly3_demo.py', """
model = dict(
    backbone=dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)),
    neck=dict(in_channels=[16, 32, 64, 128], out_channels=16),
    decode_head=dict(in_channels=[16, 16, 16, 16], channels=16))
train_dataloader = dict(batch_size=2)
"""),
    'cls': ('cls_xcit_s12_poly3_demo.py', """
model = dict(backbone=dict(embed_dims=32, depth=2, num_heads=4, cls_attn_layers=1), head=dict(in_channels=32))
train_dataloader = dict(batch_size=8, dataset=dict(indices=16))
"""),
}


def shared_demo_root(tmp_path_factory, subset='imagenet') -> str:
    return str(tmp_path_factory.getbasetemp() / 'shared_demo' / 'data' / 'demo' / subset)
