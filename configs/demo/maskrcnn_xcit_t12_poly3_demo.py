# `make demo`'s detector step: maskrcnn_xcit_s12_poly3_demo.py (data, anchors, proposal and RoI counts, schedule
# type) with the XCiT-T12/16 backbone (embedding 192, 4 heads; the same poly3 XCA layers and stride-fixing adapter)
# started from cls_xcit_t12_poly3_demo.py's checkpoint, and a neck and heads sized for 160 px digits on a CPU.
# Demo-sized (the structure and losses are the real config's): FPN, RPN and RoI heads 64 channels wide instead of 256
# (their 3x3 convolutions on the stride-4 level were most of a step), a 256-wide box head fc instead of 1024,
# class-agnostic masks and box regression (class-specific ones give each digit a tenth of the few hundred steps:
# their mask loss stayed near log 2 for the first 150), AdamW lr 6e-4 instead of 3e-4. A step costs about a quarter
# of the full-width one, so 400 iterations (two passes over the training set) take the time 100 did.
# 1 process (CPU) x 4 images per batch.
_base_ = './maskrcnn_xcit_s12_poly3_demo.py'
width = 64
num_iters = 400
model = dict(
    backbone=dict(arch='t12'),
    neck=dict(in_channels=[192, 192, 192, 192], out_channels=width),
    rpn_head=dict(in_channels=width, feat_channels=width),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=width),
        bbox_head=dict(in_channels=width, fc_out_channels=256, reg_class_agnostic=True),
        mask_roi_extractor=dict(out_channels=width),
        mask_head=dict(in_channels=width, conv_out_channels=width, class_agnostic=True)))
train_cfg = dict(max_iters=num_iters, val_begin=num_iters + 1, val_interval=num_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=num_iters, milestones=[int(num_iters * 0.8)], gamma=0.1)
]
optim_wrapper = dict(optimizer=dict(lr=6e-4))
default_hooks = dict(checkpoint=dict(interval=num_iters))
