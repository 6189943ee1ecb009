# The warm-start recipe 'transfer-final' at the digits scale:
# the default with final-feature distillation added to stage 1: the student's own end-to-end output against the
# teacher's (that pass runs the whole student without with_cp).
# Written by `python tools/warm_start.py --write-recipe-configs` from softfree_mm/engine/warm_start.py (the one
# definition the small-scale grid takes too); do not edit: tests/tools/test_warm_start_chain.py checks it.
# 75 iterations of 32 images in all: stage 1 25, stage 2 50; learning rates 3x and 0.1x
# the from-scratch classifier's (0.001), cosine to 0.01x, each after a linear warm-up over 10% of its stage.
warm_start = {'recipe': 'transfer-final', 'scale': 'digits'}
stage1_train = ['kernel', 'qkv']
stage1_loss = 'blocks+final'
stage1_train_cfg = {'_delete_': True, 'type': 'IterBasedTrainLoop', 'max_iters': 25}
stage1_optim_wrapper = {'_delete_': True, 'type': 'OptimWrapper', 'optimizer': {'type': 'AdamW', 'weight_decay': 0.0, 'eps': 1e-08, 'betas': (0.9, 0.999), 'lr': 0.003}, 'clip_grad': {'max_norm': 5.0}}
stage1_param_scheduler = [{'type': 'LinearLR', 'start_factor': 0.01, 'by_epoch': False, 'begin': 0, 'end': 2}, {'type': 'CosineAnnealingLR', 'eta_min': 1e-05, 'by_epoch': False, 'begin': 2, 'end': 25}]
stage1_default_hooks = {'checkpoint': {'by_epoch': False, 'interval': 25, 'max_keep_ckpts': 2}, 'logger': {'interval': 5}}
stage1_log_processor = {'by_epoch': False}
finetune_head = 'release'
finetune_train_cfg = {'_delete_': True, 'type': 'IterBasedTrainLoop', 'max_iters': 50, 'val_interval': 50}
finetune_optim_wrapper = {'optimizer': {'lr': 0.0001}}
finetune_param_scheduler = [{'type': 'LinearLR', 'start_factor': 0.01, 'by_epoch': False, 'begin': 0, 'end': 5}, {'type': 'CosineAnnealingLR', 'eta_min': 1e-05, 'by_epoch': False, 'begin': 5, 'end': 50}]
finetune_default_hooks = {'checkpoint': {'by_epoch': False, 'interval': 50, 'max_keep_ckpts': 2}, 'logger': {'interval': 5}}
finetune_log_processor = {'by_epoch': False}
