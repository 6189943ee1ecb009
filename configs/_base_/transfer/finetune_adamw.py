# Stage 2 of the warm start, the recipe every configs/finetune_*.py takes: the kernel's classifier (its
# configs/cls_*.py: data, augmentation, Mixup / CutMix, label smoothing, batch 1024 on 8 GPUs) with its backbone from
# stage 1 (configs/transfer_*.py) and a new linear head, fine-tuned 20 epochs: AdamW lr 2e-4, wd 0.05, 1 warm-up epoch,
# cosine to 1e-6. Stage 1's 10 epochs and these 20 are 10 % of the 300-epoch from-scratch recipe.
finetune_epochs = 20
finetune_train_cfg = dict(max_epochs=finetune_epochs)
finetune_optim_wrapper = dict(optimizer=dict(lr=2e-4))
finetune_param_scheduler = [
    dict(type='LinearLR', start_factor=1e-2, by_epoch=True, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=1, end=finetune_epochs)
]
