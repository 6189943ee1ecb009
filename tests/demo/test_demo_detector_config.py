"""`make demo`'s detector (configs/demo/maskrcnn_xcit_t12_poly3_demo.py) is the real config's Mask R-CNN
(configs/maskrcnn_xcit_s12_poly3.py) at demo size: every part and loss of the real model, with only widths, class
counts, class sharing, anchor scale, proposal / RoI counts and the backbone's start changed. The S12 demo config keeps
the real neck and heads.

Guards: the two model configs compared leaf by leaf (a new or dropped part, another type or loss anywhere, fails);
the built demo model has the 64-channel FPN / RPN / RoI heads, the four mask convs of the real head and one mask /
box-regression output for all classes.
"""
import os.path as osp

from mmengine.config import Config

from tests.helpers import ROOT
REAL = osp.join(ROOT, 'configs', 'maskrcnn_xcit_s12_poly3.py')
DEMO = osp.join(ROOT, 'configs', 'demo', 'maskrcnn_xcit_t12_poly3_demo.py')
DEMO_S12 = osp.join(ROOT, 'configs', 'demo', 'maskrcnn_xcit_s12_poly3_demo.py')

# what the demo may change, and nothing else
WIDTHS = {'neck.in_channels', 'neck.out_channels', 'rpn_head.in_channels', 'rpn_head.feat_channels',
          'roi_head.bbox_roi_extractor.out_channels', 'roi_head.bbox_head.in_channels',
          'roi_head.bbox_head.fc_out_channels', 'roi_head.mask_roi_extractor.out_channels',
          'roi_head.mask_head.in_channels', 'roi_head.mask_head.conv_out_channels', 'backbone.arch'}
CLASSES = {'roi_head.bbox_head.num_classes', 'roi_head.mask_head.num_classes', 'roi_head.bbox_head.reg_class_agnostic',
           'roi_head.mask_head.class_agnostic'}
COUNTS = {'rpn_head.anchor_generator.scales', 'train_cfg.rpn_proposal.nms_pre', 'train_cfg.rpn_proposal.max_per_img',
          'train_cfg.rcnn.sampler.num', 'test_cfg.rpn.nms_pre', 'test_cfg.rpn.max_per_img', 'test_cfg.rcnn.max_per_img'}
START = {'backbone.init_cfg.checkpoint', 'backbone.init_cfg.prefix'}


def _leaves(node, path=''):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(_leaves(value, f'{path}.{key}' if path else key))
        return out
    return {path: node}


def _differences(a, b):
    la, lb = _leaves(a), _leaves(b)
    return {k: (la.get(k), lb.get(k)) for k in set(la) | set(lb) if la.get(k, '<absent>') != lb.get(k, '<absent>')}


def test_demo_detector_is_the_real_model_with_only_widths_classes_counts_and_start_changed():
    real = Config.fromfile(REAL).model.to_dict()
    demo = Config.fromfile(DEMO).model.to_dict()
    diff = _differences(real, demo)
    assert set(diff) <= WIDTHS | CLASSES | COUNTS | START, sorted(set(diff) - WIDTHS - CLASSES - COUNTS - START)
    assert not [k for k in diff if k.endswith('type')]
    # demo-sized: the neck and heads at 64 channels, a 256-wide box fc, the real mask head's four convs
    assert diff['neck.out_channels'] == (256, 64) and diff['roi_head.bbox_head.fc_out_channels'] == (1024, 256)
    assert demo['roi_head']['mask_head']['num_convs'] == real['roi_head']['mask_head']['num_convs'] == 4
    assert diff['roi_head.mask_head.class_agnostic'] == (None, True)
    assert diff['roi_head.bbox_head.reg_class_agnostic'] == (False, True)


def test_s12_demo_detector_keeps_the_real_neck_and_heads():
    diff = _differences(Config.fromfile(REAL).model.to_dict(), Config.fromfile(DEMO_S12).model.to_dict())
    assert set(diff) <= {'roi_head.bbox_head.num_classes', 'roi_head.mask_head.num_classes'} | COUNTS | START, diff


def test_built_demo_detector_has_demo_width_heads_and_one_mask_for_all_classes():
    import softfree_mm  # noqa: F401  (registers the backbone)
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules()
    cfg = Config.fromfile(DEMO)
    cfg.model.backbone.init_cfg = dict(type='Scratch')
    cfg.model.backbone.norm_cfg = dict(type='BN', requires_grad=True)  # SyncBN needs a process group
    model = MODELS.build(cfg.model)
    assert [c.conv.out_channels for c in model.neck.fpn_convs] == [64] * 4
    assert model.rpn_head.rpn_conv.out_channels == 64
    assert model.roi_head.bbox_head.shared_fcs[-1].out_features == 256
    assert model.roi_head.bbox_head.fc_reg.out_features == 4  # one box for all ten classes
    mask = model.roi_head.mask_head
    assert len(mask.convs) == 4 and all(c.conv.out_channels == 64 for c in mask.convs)
    assert mask.conv_logits.out_channels == 1  # one mask for all ten classes
    assert model.roi_head.bbox_head.fc_cls.out_features == 11  # ten digits + background
