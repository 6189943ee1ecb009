# maskrcnn / pvt_v2_b2: InLine set-up: InLine in stages 1-3, softmax in stage 4, no spatial reduction (InLine, NeurIPS 2024).
# Everything else (recipe, GPUs x images per GPU, schedule) is maskrcnn_pvt_v2_b2_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
# Backbone start: no release exists for this kernel: the warm start from the softmax release
# (docs/warm_start.md): configs/transfer_pvt_v2_b2_inline.py, then configs/finetune_pvt_v2_b2_inline.py, whose work dir
# (work_dirs/finetune_pvt_v2_b2_inline: its last checkpoint) this loads; `python tools/warm_start.py configs/maskrcnn_pvt_v2_b2_inline.py`
# runs what is missing, then this config. A missing start stops training with both ways on: make it, or start from
# softmax_release with the kernel swapped.
_base_ = './maskrcnn_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='work_dirs/finetune_pvt_v2_b2_inline'),
        attn_cfg=['inline', 'inline', 'inline', 'softmax'],
        sr_ratios=(1, 1, 1, 1)))
