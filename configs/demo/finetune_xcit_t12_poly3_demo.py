# Stage 2 of the warm start at demo scale, 1 process (CPU) x 32 images: the poly3 classifier of
# cls_xcit_t12_poly3_demo.py, its backbone from stage 1 (configs/demo/transfer_xcit_t12_poly3_demo.py's work dir:
# its last checkpoint), its head the softmax classifier's, fine-tuned by the recipe's stage 2 at the digits scale
# (recipe_transfer_digits.py).
_base_ = ['./cls_xcit_t12_poly3_demo.py', '../_base_/transfer/recipe_transfer_digits.py']
cls_release = 'work_dirs/cls_xcit_t12_softmax_demo'
model = dict(
    backbone=dict(
        init_cfg=dict(type='Pretrained', checkpoint='work_dirs/transfer_xcit_t12_poly3_demo', prefix='backbone.')),
    head=dict(init_cfg=dict(_delete_=True, type='ReleaseHead', checkpoint=cls_release)))
train_cfg = {{_base_.finetune_train_cfg}}
optim_wrapper = {{_base_.finetune_optim_wrapper}}
param_scheduler = {{_base_.finetune_param_scheduler}}
default_hooks = {{_base_.finetune_default_hooks}}
log_processor = {{_base_.finetune_log_processor}}
