# CPU demo of configs/upernet_swin_t_poly3.py on the embedded ADE20K-style digits data (tools/make_demo_data.py: background ->
# class 0, digit d -> class d + 1 after reduce_zero_label). Changed: data root, image scale (crop 128), schedule
# (300 iterations, AdamW lr 3e-4). 1 process (CPU) x 4 images.
_base_ = '../upernet_swin_t_poly3.py'

data_root = 'data/demo/ade'
crop_size = (128, 128)
num_iters = 300
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(160, 128), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(160, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs')
]
model = dict(data_preprocessor=dict(size=crop_size),
             backbone=dict(init_cfg=dict(_delete_=True, type='Scratch')))  # from scratch on purpose
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
train_cfg = dict(max_iters=num_iters, val_interval=num_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=30, end=num_iters)
]
optim_wrapper = dict(optimizer=dict(lr=3e-4))
auto_scale_lr = dict(base_batch_size=4)
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=num_iters, max_keep_ckpts=1))

# a fixed seed: the demo gives the same numbers run after run (up to CPU kernel nondeterminism)
randomness = dict(seed=0)
