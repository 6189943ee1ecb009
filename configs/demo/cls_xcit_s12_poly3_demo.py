# The pretraining step of the demo (`make demo` runs it at T12 width: cls_xcit_t12_poly3_demo.py):
# configs/cls_xcit_s12_poly3.py's classifier (XCiT-S12/16, poly3 in every XCA layer, class-attention layers, linear
# head) learns the ten digits of the embedded ImageNet-style set (tools/make_demo_data.py: 4,500 train and 500 val
# crops of 32 px, one digit of 24-32 px each). Its checkpoint starts the demo Mask R-CNN's backbone
# (configs/demo/maskrcnn_xcit_s12_poly3_demo.py, init_cfg Pretrained with prefix 'backbone.').
# Changed from the real config: data root and image scale (32 px: a 2 x 2 token grid; no RandAugment / random
# erasing / flips: digits are not mirror-symmetric and two epochs leave no room for heavy augmentation), a 10-way
# head without Mixup / CutMix, no drop path, the schedule (2 epochs = 282 iterations, warm-up + cosine, AdamW lr 1e-3,
# batch 32: what fits `make demo`'s 10 minutes on 2 CPU cores at T12 width).
# 1 process (CPU) x 32 images.
_base_ = '../cls_xcit_s12_poly3.py'
data_root = 'data/demo/imagenet'
img_size = 32
model = dict(
    backbone=dict(drop_path_rate=0.0),
    head=dict(num_classes=10, topk=(1, )),
    train_cfg=dict(augments=None))
data_preprocessor = dict(num_classes=10)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=img_size, crop_ratio_range=(0.7, 1.0), backend='pillow',
         interpolation='bicubic'),
    dict(type='PackInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=img_size, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=img_size),
    dict(type='PackInputs')
]
train_dataloader = dict(batch_size=32, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(batch_size=50, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(topk=(1, ))
test_evaluator = val_evaluator
max_epochs = 2
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),  # 20 warm-up iterations
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=0, end=max_epochs, convert_to_iter_based=True)
]
optim_wrapper = dict(optimizer=dict(lr=1e-3))
auto_scale_lr = dict(base_batch_size=32)
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=max_epochs, max_keep_ckpts=1))
log_processor = dict(window_size=10)

# a fixed seed: two runs on the same machine (same torch thread count) give the same numbers
randomness = dict(seed=0)
