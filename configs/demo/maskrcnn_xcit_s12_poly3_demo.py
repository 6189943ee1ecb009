# CPU demo of configs/maskrcnn_xcit_s12_poly3.py on the embedded digits data (tools/make_demo_data.py).
# Changed from the real config: data root + the 10 digit classes, image scale (about 256 px), schedule (200 iterations,
# batch 2, AdamW lr 6e-4), and the RPN proposal / RoI-sampling counts (the CPU cost is in the heads).
# 1 process (CPU) x 2 images per batch.
_base_ = '../maskrcnn_xcit_s12_poly3.py'

data_root = 'data/demo/coco/'
metainfo = dict(classes=tuple(f'digit_{d}' for d in range(10)))
num_iters = 200
model = dict(
    backbone=dict(init_cfg=dict(_delete_=True, type='Scratch')),  # from scratch on purpose (no ImageNet start)
    roi_head=dict(bbox_head=dict(num_classes=10), mask_head=dict(num_classes=10)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=400, max_per_img=200),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rpn=dict(nms_pre=400, max_per_img=200)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomChoiceResize', scales=[(288, 224), (320, 256), (352, 288)], keep_ratio=True),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(320, 256), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
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
optim_wrapper = dict(optimizer=dict(lr=6e-4), clip_grad=dict(max_norm=10.0))
auto_scale_lr = dict(base_batch_size=2)
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(by_epoch=False, interval=num_iters, max_keep_ckpts=1))
log_processor = dict(by_epoch=False)

# a fixed seed: the demo gives the same numbers run after run (up to CPU kernel nondeterminism)
randomness = dict(seed=0)
