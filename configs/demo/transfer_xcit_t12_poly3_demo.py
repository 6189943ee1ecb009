# Stage 1 of the warm start at demo scale, 1 process (CPU) x 32 images (docs/warm_start.md; `python
# tools/warm_start.py configs/demo/maskrcnn_xcit_t12_poly3_warm_demo.py` runs the chain): attention transfer from a
# softmax XCiT-T12/16 digit classifier (the demo's pretraining config with softmax: `python tools/train.py
# configs/demo/cls_xcit_t12_poly3_demo.py --cfg-options model.backbone.attn_cfg=softmax --work-dir
# work_dirs/cls_xcit_t12_softmax_demo`, or --release PATH) to the poly3 student of cls_xcit_t12_poly3_demo.py.
# Recipe: the one recipe at the digits scale (recipe_transfer_digits.py beside the ImageNet one).
_base_ = ['./cls_xcit_t12_poly3_demo.py', '../_base_/transfer/recipe_transfer_digits.py']
cls_release = 'work_dirs/cls_xcit_t12_softmax_demo'  # its work dir: its last checkpoint
teacher = dict(
    type='SoftFreeXCiT',
    arch='t12',
    patch_size=16,
    out_type='cls_token',
    norm_cfg=dict(type='BN', requires_grad=True),
    attn_cfg=dict(type='softmax'),
    init_cfg=dict(type='Pretrained', checkpoint=cls_release, prefix='backbone.'))
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
