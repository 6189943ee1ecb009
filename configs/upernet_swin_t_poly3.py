# upernet / swin_t: polynomial attention x^3 scaled by 1/sqrt(N) (polynomial attention, arXiv 2410.18613).
# Everything else (recipe, GPUs x images per GPU, schedule) is upernet_swin_t_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
# Backbone start: no release exists for this kernel: the warm start from the softmax release
# (docs/warm_start.md): configs/transfer_swin_t_poly3.py, then configs/finetune_swin_t_poly3.py, whose work dir
# (work_dirs/finetune_swin_t_poly3: its last checkpoint) this loads; `python tools/warm_start.py configs/upernet_swin_t_poly3.py`
# runs what is missing, then this config. A missing start stops training with both ways on: make it, or start from
# softmax_release with the kernel swapped.
_base_ = './upernet_swin_t_softmax.py'
model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='work_dirs/finetune_swin_t_poly3'),
        attn_cfg=dict(_delete_=True, type='poly', degree=3)))
