# upernet / cswin_t: SOFT set-up: SOFT in stages 1-3 (landmark ratios 8/4/2) in stripes as wide as the stage, softmax in stage 4 (SOFT, arXiv 2110.11945).
# Gaussian kernel with tied keys, Nystrom landmarks by a strided conv, 20 Newton steps (fp32), depthwise conv on v of size 9 / 5 / 3 (the official forms).
# Everything else (recipe, GPUs x images per GPU, schedule) is upernet_cswin_t_softmax.py.
# Reported: no number in the anchors for this backbone; SOFT's own backbone, SOFT-Small-Norm, reached UperNet mIoU 46.2.
# Backbone start: no release exists for this kernel: the warm start from the softmax release
# (docs/warm_start.md): configs/transfer_cswin_t_soft.py, then configs/finetune_cswin_t_soft.py, whose work dir
# (work_dirs/finetune_cswin_t_soft: its last checkpoint) this loads; `python tools/warm_start.py configs/upernet_cswin_t_soft.py`
# runs what is missing, then this config. A missing start stops training with both ways on: make it, or start from
# softmax_release with the kernel swapped.
_base_ = './upernet_cswin_t_softmax.py'
model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='work_dirs/finetune_cswin_t_soft'),
        attn_cfg=[dict(type='soft', landmark_ratio=8, conv_size=9), dict(type='soft', landmark_ratio=4, conv_size=5),
                  dict(type='soft', landmark_ratio=2, conv_size=3), 'softmax'],
        global_window=True))
