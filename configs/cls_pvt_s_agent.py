# cls / pvt_s: the official Agent-PVT-S (Agent Attention, ECCV 2024): PVT v1 (SoftFreePVT arch 'agent_small': heads 1-2-5-8,
# no spatial reduction) with agent attention (agents 9-16-49-49, biases at the 56-28-14-7 grids, a 3x3 depthwise conv on
# v) in every stage -> global average pooling -> linear head (the official model has no final norm).
# Recipe (the official cfgs/agent_pvt_s.yaml): AdamW lr 5e-4 per 512 images (1e-3 for the total batch 1024 here),
# wd 0.05, 300 epochs, drop path 0.1; 8 GPUs x 128 images (total batch 1024), 224x224.
# Reported: top-1 82.2 (Agent-Attention README, the official release).
# Parameters / FLOPs (tools/analysis/get_flops.py, 224x224): ours 20.635M, 3.971 GFLOPs; reported 20.6M, 4.0G:
#   Agent-Attention README.
# Release: https://cloud.tsinghua.edu.cn/f/36b8be9a8863456685a3/?dl=1. As shipped the model IS the release: the
#   backbone converted on load (Pretrained), the linear classifier read from the release's head.* (ReleaseHead), so
#   `python tools/test.py configs/cls_pvt_s_agent.py init` evaluates it (top-1 82.2 reported) and tools/train.py
#   fine-tunes it. Training from scratch with the official recipe instead:
#   --cfg-options model.backbone.init_cfg.type=Scratch model.head.init_cfg.type=Scratch (the head then keeps
#   torch's initialisation of its linear layer, not the base config's TruncNormal std 0.02).
_base_ = './cls_pvt_s_inline.py'
agent_release = 'https://cloud.tsinghua.edu.cn/f/36b8be9a8863456685a3/?dl=1'
model = dict(
    backbone=dict(arch='agent_small', init_cfg=dict(type='Pretrained', checkpoint=agent_release)),
    head=dict(init_cfg=dict(_delete_=True, type='ReleaseHead', checkpoint=agent_release)))
