# Stage 1 of the warm start for Swin-T (attention transfer): the teacher is Swin-T with softmax and the official
# release swin_tiny_patch4_window7_224.pth (81.2 top-1), frozen; the student is the backbone of
# configs/cls_swin_t_softmax.py (a configs/transfer_swin_t_*.py sets its kernel as the matching cls_swin_t_*.py does)
# starting from the teacher's weights. Recipe: configs/_base_/transfer/stage1_adamw.py. Images only: no validation.
_base_ = ['../../cls_swin_t_softmax.py', './stage1_adamw.py']
teacher = dict(
    type='SoftFreeSwin',
    arch='tiny',
    out_indices=(3, ),
    attn_cfg=dict(type='softmax'),
    init_cfg=dict(
        type='Pretrained',
        checkpoint='https://github.com/SwinTransformer/storage/releases/download/v1.0.0/'
        'swin_tiny_patch4_window7_224.pth'))
model = dict(
    type='AttentionTransfer',
    teacher=teacher,
    train=['kernel', 'qkv'],
    backbone=dict(drop_path_rate=0.0))
train_cfg = {{_base_.stage1_train_cfg}}
optim_wrapper = {{_base_.stage1_optim_wrapper}}
param_scheduler = {{_base_.stage1_param_scheduler}}
default_hooks = {{_base_.stage1_default_hooks}}
val_dataloader = None
val_evaluator = None
val_cfg = None
test_dataloader = None
test_evaluator = None
test_cfg = None
