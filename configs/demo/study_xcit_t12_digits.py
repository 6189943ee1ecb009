# The kernel study's channel-attention backbone (tools/analysis/study.py, docs/study.md): `make demo`'s pretraining
# classifier (cls_xcit_t12_poly3_demo.py: XCiT-T12/16 from scratch on the 32 px digit crops, batch 32, AdamW lr 1e-3,
# label smoothing 0.1, no augmentation beyond the random resized crop) with the study's own schedule: a fixed number
# of iterations, validated four times, and AttentionStatsHook on (||A||_F and the score-Jacobian norm of every XCA
# layer every 10 iterations and at the first). The study sets attn_cfg per run; softmax here is XCiT's own.
# Iteration-based so that every kernel gets the same updates and `best` has several validations to choose from.
# 1 process (CPU) x 32 images.
_base_ = './cls_xcit_t12_poly3_demo.py'
model = dict(backbone=dict(attn_cfg=dict(_delete_=True, type='softmax')))
custom_hooks = [dict(type='AttentionStatsHook', interval=10)]

max_iters = 300
val_interval = 75
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=val_interval)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),  # 20 warm-up iterations
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=0, end=max_iters)
]
# validation records at their iteration (not the epoch, which stays 0 in an iteration-based loop)
default_hooks = dict(logger=dict(interval=10, log_metric_by_epoch=False),
                     checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1))
log_processor = dict(by_epoch=False, window_size=10)
