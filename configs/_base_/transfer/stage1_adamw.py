# Stage 1 of the warm start (attention transfer, softfree_mm/models/transfer.py), the recipe every
# configs/transfer_*.py takes through configs/_base_/transfer/<backbone>.py: ImageNet images (labels unread), each
# student block matching its softmax twin's output from the twin's input. AdamW lr 1e-3 for total batch 1024 (8 GPUs x
# 128), no weight decay (only the kernel's own parameters, the new layout's and the input projections train), 200
# warm-up iterations then cosine, 12,510 iterations = 10 ImageNet epochs; a checkpoint every 2,500 iterations.
stage1_iters = 12510
stage1_train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=stage1_iters)
stage1_optim_wrapper = dict(
    _delete_=True, type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.0, eps=1e-8, betas=(0.9, 0.999)),
    clip_grad=dict(max_norm=5.0))
stage1_param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=200),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=False, begin=200, end=stage1_iters)
]
stage1_default_hooks = dict(checkpoint=dict(by_epoch=False, interval=2500, max_keep_ckpts=2),
                            logger=dict(interval=50))
