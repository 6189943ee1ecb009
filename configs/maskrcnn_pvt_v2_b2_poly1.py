# maskrcnn / pvt_v2_b2: polynomial attention x^1 scaled by 1/sqrt(N) (arXiv 2410.18613; linear cost).
# Everything else (recipe, GPUs x images per GPU, schedule) is maskrcnn_pvt_v2_b2_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
# Backbone start: no release exists for this kernel: the warm start from the softmax release
# (docs/warm_start.md): configs/transfer_pvt_v2_b2_poly1.py, then configs/finetune_pvt_v2_b2_poly1.py, whose work dir
# (work_dirs/finetune_pvt_v2_b2_poly1: its last checkpoint) this loads; `python tools/warm_start.py configs/maskrcnn_pvt_v2_b2_poly1.py`
# runs what is missing, then this config. A missing start stops training with both ways on: make it, or start from
# softmax_release with the kernel swapped.
_base_ = './maskrcnn_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='work_dirs/finetune_pvt_v2_b2_poly1'),
        attn_cfg=dict(_delete_=True, type='poly', degree=1)))
