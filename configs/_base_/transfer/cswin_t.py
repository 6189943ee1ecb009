# Stage 1 of the warm start for CSWin-T (attention transfer): the teacher is CSWin-T with softmax and the official
# release cswin_tiny_224.pth (82.7 top-1), frozen; the student is the backbone of configs/cls_cswin_t_softmax.py (a
# configs/transfer_cswin_t_*.py sets its kernel as the matching cls_cswin_t_*.py does) starting from the teacher's
# weights. Recipe: configs/_base_/transfer/recipe_transfer.py (the layout's default). Images only: no
# validation.
_base_ = ['../../cls_cswin_t_softmax.py', './recipe_transfer.py', './cswin_t_release.py']
teacher = dict(
    type='SoftFreeCSWin',
    arch='tiny',
    out_indices=(3, ),
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
