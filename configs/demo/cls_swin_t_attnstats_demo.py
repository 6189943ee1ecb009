# CPU demo of AttentionStatsHook (softfree_mm/engine/hooks/attention_stats.py): Swin-T with poly3 attention (x^3 / sqrt(N)
# in every window) trained on the digits classification demo; every 10 iterations (and at the first) the hook writes
# ||A||_F and the score-Jacobian norm of every attention layer and head to work_dir/<run>/vis_data/attention_stats.json
# (and to TensorBoard when vis_backends has TensorboardVisBackend). Plot: tools/analysis/plot_attention_stats.py.
# Data, pipelines and schedule: those of the XCiT classification demo (cls_xcit_s12_poly3_demo.py); the model:
# configs/cls_swin_t_poly3.py's (Swin-T, 7x7 windows, GAP neck, linear head). 1 process (CPU) x 32 images.
_base_ = './cls_xcit_s12_poly3_demo.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreeSwin',
        arch='tiny',
        attn_cfg=dict(type='poly', degree=3),
        drop_path_rate=0.2,
        out_indices=(3, ),
        init_cfg=dict(type='Scratch')),  # from scratch, as the classification configs
    neck=dict(_delete_=True, type='GlobalAveragePooling'),
    head=dict(in_channels=768))
custom_hooks = [dict(type='AttentionStatsHook', interval=10)]

# 64 px inputs (the 32 px digit crops scaled up: Swin-T's 7x7 windows then see an 16x16 first-stage grid) and one
# epoch (141 iterations of 32), its own schedule
img_size = 64
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
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
max_epochs = 1
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=0, end=max_epochs, convert_to_iter_based=True)
]
default_hooks = dict(checkpoint=dict(interval=max_epochs))
