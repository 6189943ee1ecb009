# The collapse's arm 3 (tools/analysis/task_study.py, layout pvt_long; docs/study.md, "The collapse's arms with
# controls that train"): semfpn_pvt_v2_b0_digits.py with the schedule twice as long, 6000 iterations instead of 3000
# (the same warm-up of 30, then poly decay to zero at the new end). Everything else unchanged. The study sets attn_cfg
# per run. 1 process (CPU) x 4 images.
_base_ = './semfpn_pvt_v2_b0_digits.py'
num_iters = 6000
train_cfg = dict(max_iters=num_iters, val_interval=num_iters + 1)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=30, end=num_iters)
]
default_hooks = dict(checkpoint=dict(interval=num_iters, max_keep_ckpts=1))
