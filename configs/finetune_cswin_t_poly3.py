# finetune / cswin_t / poly3 (8 GPUs x 128 images): stage 2 of the warm start
# (configs/_base_/transfer/recipe_transfer.py, the layout's default): the classifier of
# configs/cls_cswin_t_poly3.py, its backbone from stage 1 (python tools/train.py configs/transfer_cswin_t_poly3.py),
# its head the release's classifier, fine-tuned on ImageNet (the recipe's stage 2). Its checkpoint is the backbone
# start of the kernel's detection and segmentation configs.
_base_ = ['./cls_cswin_t_poly3.py', './_base_/transfer/recipe_transfer.py',
          './_base_/transfer/cswin_t_release.py']
model = dict(
    backbone=dict(
        init_cfg=dict(
            type='Pretrained',
            checkpoint='work_dirs/transfer_cswin_t_poly3',
            prefix='backbone.')),
    head=dict(init_cfg=dict(_delete_=True, type='ReleaseHead', checkpoint={{_base_.cls_release}})))
train_cfg = {{_base_.finetune_train_cfg}}
optim_wrapper = {{_base_.finetune_optim_wrapper}}
param_scheduler = {{_base_.finetune_param_scheduler}}
default_hooks = {{_base_.finetune_default_hooks}}
log_processor = {{_base_.finetune_log_processor}}
