# Mask R-CNN 3x (36 epochs, lr steps at 27 and 33), AdamW lr 1e-4, wd 0.05, total batch 16 (8 GPUs x 2 images).
# No weight decay on norms, biases, positional / relative-position tables, class tokens and XCiT's temperature.
max_epochs = 36
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33], gamma=0.1)
]
no_decay = dict(decay_mult=0.)
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0., custom_keys={
        'absolute_pos_embed': no_decay, 'pos_embed': no_decay, 'relative_position_bias_table': no_decay,
        'cls_token': no_decay, 'temperature': no_decay}))
# `--auto-scale-lr` rescales lr by (GPUs x images per GPU) / base_batch_size
auto_scale_lr = dict(enable=False, base_batch_size=16)
