# The kernel study's token-attention classifier (study_pvt_v2_b0_digits.py) on a schedule twice as long: 600
# iterations, the warm-up 40, validated four times. The warm-start carry-over test's longer digits schedule
# (docs/warm_start.md, "What carries from digits to ImageNet"): its softmax classifiers are the teachers whose warm
# starts at 10 % (60 iterations) give stage 1 twice the steps of 10 % of the 300-iteration schedule.
# 1 process (CPU) x 32 images.
_base_ = './study_pvt_v2_b0_digits.py'
max_iters = 600
val_interval = 150
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=val_interval)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=40),  # 40 warm-up iterations
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=0, end=max_iters)
]
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1))
