# Stage 1 of the warm start for XCiT-S12/16 (attention transfer): the teacher is XCiT-S12/16 with softmax and the
# official release xcit_small_12_p16_224.pth (82.0 top-1), frozen; the student is the backbone of
# configs/cls_xcit_s12_softmax.py (a configs/transfer_xcit_s12_*.py sets its kernel as the matching cls_xcit_s12_*.py
# does) starting from the teacher's weights. Recipe: configs/_base_/transfer/recipe_transfer.py. Images only: no
# validation.
_base_ = ['../../cls_xcit_s12_softmax.py', './recipe_transfer.py', './xcit_s12_release.py']
teacher = dict(
    type='SoftFreeXCiT',
    arch='s12',
    patch_size=16,
    out_type='cls_token',
    norm_cfg=dict(type='BN', requires_grad=True),
    attn_cfg=dict(type='softmax'),
    init_cfg=dict(
        type='Pretrained',
        checkpoint={{_base_.cls_release}}))
model = dict(
    type='AttentionTransfer',
    teacher=teacher,
    train={{_base_.stage1_train}},
    loss={{_base_.stage1_loss}})
train_cfg = {{_base_.stage1_train_cfg}}
optim_wrapper = {{_base_.stage1_optim_wrapper}}
param_scheduler = {{_base_.stage1_param_scheduler}}
default_hooks = {{_base_.stage1_default_hooks}}
log_processor = {{_base_.stage1_log_processor}}
val_dataloader = None
val_evaluator = None
val_cfg = None
test_dataloader = None
test_evaluator = None
test_cfg = None
