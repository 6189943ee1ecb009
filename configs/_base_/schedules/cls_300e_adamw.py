# ImageNet-1k from scratch (DeiT / Swin recipe): 300 epochs, AdamW lr 1e-3 for total batch 1024 (8 GPUs x 128),
# wd 0.05, 20 warm-up epochs then cosine, gradient clipping 5. No weight decay on norms, biases, tables, tokens and
# XCiT's temperature.
max_epochs = 300
warmup_epochs = 20
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)
val_cfg = dict()
test_cfg = dict()
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=warmup_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=warmup_epochs, end=max_epochs)
]
no_decay = dict(decay_mult=0.)
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0., flat_decay_mult=0., custom_keys={
        'absolute_pos_embed': no_decay, 'pos_embed': no_decay, 'relative_position_bias_table': no_decay,
        'cls_token': no_decay, 'temperature': no_decay}),
    clip_grad=dict(max_norm=5.0))
auto_scale_lr = dict(enable=False, base_batch_size=1024)
