# ADE20K Semantic FPN: the ADE20K AdamW recipe (lr 6e-5, wd 0.01, warm-up, poly) over 80k iterations.
_base_ = './seg_160k_adamw.py'
max_iters = 80000
val_interval = 8000
train_cfg = dict(max_iters=max_iters, val_interval=val_interval)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=max_iters)
]
