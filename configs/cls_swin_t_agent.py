# cls / swin_t: the official Agent-Swin-T (Agent Attention, ECCV 2024): arch 'agent_tiny' of SoftFreeSwin, 'AAAB': agent
# attention (agents 9-16-49, biases at the 56-28-14 grids, a 3x3 depthwise conv on v) over the whole grid in stages 1-3,
# softmax windows in stage 4 (cfgs/agent_swin_t.yaml).
# Everything else (recipe, GPUs x images per GPU, schedule) is cls_swin_t_softmax.py.
# Reported: Agent-Swin-T ImageNet top-1 82.6 (Agent-Attention README; Swin-T 81.3).
# Parameters / FLOPs (tools/analysis/get_flops.py, 224x224): ours 28.903M, 4.518 GFLOPs; reported 29M, 4.5G:
#   Agent-Attention README.
# Release: https://cloud.tsinghua.edu.cn/f/a2ddc1190c224f768a41/?dl=1. As shipped the model IS the release: the
#   backbone converted on load (Pretrained), the linear classifier read from the release's head.* (ReleaseHead), so
#   `python tools/test.py configs/cls_swin_t_agent.py init` evaluates it (top-1 82.6 reported) and tools/train.py
#   fine-tunes it. Training from scratch with the official recipe instead:
#   --cfg-options model.backbone.init_cfg.type=Scratch model.head.init_cfg.type=Scratch (the head then keeps
#   torch's initialisation of its linear layer, not the base config's TruncNormal std 0.02).
_base_ = './cls_swin_t_softmax.py'
agent_release = 'https://cloud.tsinghua.edu.cn/f/a2ddc1190c224f768a41/?dl=1'
model = dict(
    backbone=dict(
        arch='agent_tiny',
        attn_cfg=None,
        global_window=None,
        drop_path_rate=0.2,  # cfgs/agent_swin_t.yaml
        init_cfg=dict(type='Pretrained', checkpoint=agent_release)),
    head=dict(init_cfg=dict(_delete_=True, type='ReleaseHead', checkpoint=agent_release)))
