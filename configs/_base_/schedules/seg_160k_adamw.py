# ADE20K UperNet: 160k iterations, AdamW lr 6e-5, wd 0.01, linear warm-up 1500 iters then poly decay (power 1),
# total batch 16 (8 GPUs x 2 images). No weight decay on norms, biases, position tables and XCiT's temperature.
max_iters = 160000
val_interval = 16000
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=val_interval)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=max_iters)
]
no_decay = dict(decay_mult=0.)
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0., custom_keys={
        'absolute_pos_embed': no_decay, 'pos_embed': no_decay, 'relative_position_bias_table': no_decay,
        'cls_token': no_decay, 'temperature': no_decay}))
auto_scale_lr = dict(enable=False, base_batch_size=16)
