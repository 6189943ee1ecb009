# The detector step of the demo at S12 width (`make demo` runs maskrcnn_xcit_t12_poly3_demo.py: this at T12 width,
# with a demo-sized neck and heads):
# configs/maskrcnn_xcit_s12_poly3.py's Mask R-CNN (XCiT-S12/16, poly3 in every XCA layer, its FPN, RPN and RoI heads
# unchanged) fine-tuned on the embedded digits (tools/make_demo_data.py: 800 train
# and 100 val images of 128-160 px, 4-7 digits of 24-52 px each) from the demo classifier's checkpoint, the ordinary
# way: model.backbone.init_cfg = dict(type='Pretrained', checkpoint=..., prefix='backbone.').
# Changed from the real config: data root + the 10 digit classes, image scale (the images' own 128-160 px, no flips
# or crops: digits are not mirror-symmetric), anchors one octave smaller (scales=[4]: 16-256 px, the digits' sizes),
# RPN proposal and RoI-sampling counts (the CPU cost is in the heads), at most 20 detections an image at test time (the
# images hold at most 7 digits; the mask head's cost is per detection), the schedule (iterations, warm-up, AdamW lr
# 3e-4: 1e-3 ends at a third of its AP, images per batch, gradient clipping at 10), the smallest box kept (8 px).
# 1 process (CPU) x 4 images per batch.
_base_ = '../maskrcnn_xcit_s12_poly3.py'

data_root = 'data/demo/coco/'
metainfo = dict(classes=tuple(f'digit_{d}' for d in range(10)))
# the pretraining step's checkpoint (`make demo` passes the one it has just written)
pretrained = 'work_dirs/demo/pretrain/epoch_2.pth'
num_iters = 100
model = dict(
    backbone=dict(init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    rpn_head=dict(anchor_generator=dict(scales=[4])),
    roi_head=dict(bbox_head=dict(num_classes=10), mask_head=dict(num_classes=10)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=400, max_per_img=200),
        rcnn=dict(sampler=dict(num=32))),
    test_cfg=dict(rpn=dict(nms_pre=400, max_per_img=200), rcnn=dict(max_per_img=20)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(160, 160), keep_ratio=True),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(160, 160), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),  # what mmdet's iteration-based configs use
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline,
                 filter_cfg=dict(filter_empty_gt=True, min_size=8)))
val_dataloader = dict(
    num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator

# no validation inside training (mmengine runs one at the last iteration whatever val_interval says, unless
# val_begin lies beyond the schedule): tools/test.py evaluates the final checkpoint, the same COCO evaluation
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=num_iters, val_begin=num_iters + 1,
                 val_interval=num_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=num_iters, milestones=[int(num_iters * 0.8)], gamma=0.1)
]
optim_wrapper = dict(optimizer=dict(lr=3e-4), clip_grad=dict(max_norm=10.0))
auto_scale_lr = dict(base_batch_size=4)
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(by_epoch=False, interval=num_iters, max_keep_ckpts=1),
    visualization=dict(score_thr=0.3))  # mmdet's default; the demo detector's best boxes score about 0.4-0.6
log_processor = dict(by_epoch=False, window_size=10)

# a fixed seed: two runs on the same machine (same torch thread count) give the same numbers
randomness = dict(seed=0)
