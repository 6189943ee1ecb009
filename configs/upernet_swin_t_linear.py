# upernet / swin_t: linear attention, feature map elu+1 (linear attention, Katharopoulos et al. 2020; linear cost; masks honoured in shifted/padded windows).
# Everything else (recipe, GPUs x images per GPU, schedule) is upernet_swin_t_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
# Backbone start: no release exists for this kernel: the ImageNet checkpoint of configs/cls_swin_t_linear.py
# (work_dirs/cls_swin_t_linear/epoch_300.pth); a missing file stops training with the way to make it or to opt out.
_base_ = './upernet_swin_t_softmax.py'
model = dict(
    backbone=dict(
        init_cfg=dict(checkpoint='work_dirs/cls_swin_t_linear/epoch_300.pth'),
        attn_cfg=dict(_delete_=True, type='linear', feature_map='elu+1')))
