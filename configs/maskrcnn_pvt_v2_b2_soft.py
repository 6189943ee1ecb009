# maskrcnn / pvt_v2_b2: SOFT set-up: SOFT in stages 1-3 (landmark ratios 8/4/2), softmax in stage 4, no spatial reduction (SOFT, arXiv 2110.11945).
# Gaussian kernel with tied keys, Nystrom landmarks by a strided conv, 20 Newton steps (fp32), depthwise conv on v of size 9 / 5 / 3 (the official forms).
# Everything else (recipe, GPUs x images per GPU, schedule) is maskrcnn_pvt_v2_b2_softmax.py.
# Reported: no number in the anchors for this backbone; SOFT's own backbone, SOFT-Small-Norm, reached 1x box/mask AP 43.8/40.1.
# Backbone start: no release exists for this kernel: the warm start from the softmax release
# (docs/warm_start.md): configs/transfer_pvt_v2_b2_soft.py, then configs/finetune_pvt_v2_b2_soft.py, whose work dir
# (work_dirs/finetune_pvt_v2_b2_soft: its last checkpoint) this loads; `python tools/warm_start.py configs/maskrcnn_pvt_v2_b2_soft.py`
# runs what is missing, then this config. A missing start stops training with both ways on: make it, or start from
# softmax_release with the kernel swapped.
_base_ = './maskrcnn_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='work_dirs/finetune_pvt_v2_b2_soft'),
        attn_cfg=[dict(type='soft', landmark_ratio=8, conv_size=9), dict(type='soft', landmark_ratio=4, conv_size=5),
                  dict(type='soft', landmark_ratio=2, conv_size=3), 'softmax'],
        sr_ratios=(1, 1, 1, 1),
        # activation checkpointing per block: SOFT keeps about 5 N x m float32 maps per head for backward (N tokens,
        # m landmarks; ~1050 landmarks at 1344x800 in stages 1-3), tens of GB for 2 images; checkpointed, the peak
        # is one block's (README, "GPU clusters")
        with_cp=True))
