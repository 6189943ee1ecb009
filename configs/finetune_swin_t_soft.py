# finetune / swin_t / soft (8 GPUs x 128 images): stage 2 of the warm start
# (configs/_base_/transfer/finetune_adamw.py): the classifier of configs/cls_swin_t_soft.py, its backbone from stage 1
# (python tools/train.py configs/transfer_swin_t_soft.py), fine- tuned 20 epochs on ImageNet. Its checkpoint is the
# backbone start of the kernel's detection and segmentation configs.
_base_ = ['./cls_swin_t_soft.py', './_base_/transfer/finetune_adamw.py']
model = dict(
    backbone=dict(
        init_cfg=dict(
            type='Pretrained',
            checkpoint='work_dirs/transfer_swin_t_soft/iter_12510.pth',
            prefix='backbone.')))
train_cfg = {{_base_.finetune_train_cfg}}
optim_wrapper = {{_base_.finetune_optim_wrapper}}
param_scheduler = {{_base_.finetune_param_scheduler}}
