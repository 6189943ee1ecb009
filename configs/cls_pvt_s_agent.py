# cls / pvt_s: the official Agent-PVT-S (Agent Attention, ECCV 2024): PVT v1 (SoftFreePVT arch 'agent_small': heads 1-2-5-8,
# no spatial reduction) with agent attention (agents 9-16-49-49, biases at the 56-28-14-7 grids, a 3x3 depthwise conv on
# v) in every stage -> global average pooling -> linear head (the official model has no final norm).
# Recipe (the official cfgs/agent_pvt_s.yaml): AdamW lr 5e-4 per 512 images (1e-3 for the total batch 1024 here),
# wd 0.05, 300 epochs, drop path 0.1; 8 GPUs x 128 images (total batch 1024), 224x224.
# Reported: top-1 82.2 (Agent-Attention README, the official release).
# Parameters / FLOPs (tools/analysis/get_flops.py, 224x224): ours 20.635M, 3.971 GFLOPs; reported 20.6M, 4.0G:
#   Agent-Attention README.
# Release (evaluate, or start from): https://cloud.tsinghua.edu.cn/f/36b8be9a8863456685a3/?dl=1 (converted on load).
_base_ = './cls_pvt_s_inline.py'
model = dict(backbone=dict(arch='agent_small'))
