# CPU demo of configs/cls_xcit_s12_poly3.py on the embedded ImageNet-style digits folders (10 classes, labels 0-9 of
# the 1000-way head): only data root, image scale (64 px) and schedule (10 epochs, batch 32, lr 5e-4) change.
# 1 process (CPU) x 32 images.
_base_ = '../cls_xcit_s12_poly3.py'
data_root = 'data/demo/imagenet'
img_size = 64
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=img_size, crop_ratio_range=(0.5, 1.0), backend='pillow',
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
val_dataloader = dict(batch_size=32, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
max_epochs = 10
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=True, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end=max_epochs)
]
optim_wrapper = dict(optimizer=dict(lr=5e-4))
auto_scale_lr = dict(base_batch_size=32)
default_hooks = dict(logger=dict(interval=5), checkpoint=dict(interval=max_epochs, max_keep_ckpts=1))

# a fixed seed: the demo gives the same numbers run after run (up to CPU kernel nondeterminism)
randomness = dict(seed=0)
