# upernet / pvt_v2_b2: linear attention, feature map elu+1 (linear attention, Katharopoulos et al. 2020; linear cost; masks honoured in shifted/padded windows).
# Everything else (recipe, GPUs x images per GPU, schedule) is upernet_pvt_v2_b2_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
# Backbone start: no release exists for this kernel: the warm start from the softmax release
# (docs/warm_start.md): configs/transfer_pvt_v2_b2_linear.py, then configs/finetune_pvt_v2_b2_linear.py, whose work dir
# (work_dirs/finetune_pvt_v2_b2_linear: its last checkpoint) this loads; `python tools/warm_start.py configs/upernet_pvt_v2_b2_linear.py`
# runs what is missing, then this config. A missing start stops training with both ways on: make it, or start from
# softmax_release with the kernel swapped.
_base_ = './upernet_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='work_dirs/finetune_pvt_v2_b2_linear'),
        attn_cfg=dict(_delete_=True, type='linear', feature_map='elu+1')))
