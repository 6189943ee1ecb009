# semfpn / pvt_v2_b2: linear attention, feature map elu+1 (seed 002; linear cost; masks honoured in shifted/padded windows).
# Everything else (recipe, GPUs x images per GPU, schedule) is semfpn_pvt_v2_b2_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
_base_ = './semfpn_pvt_v2_b2_softmax.py'
model = dict(
    backbone=dict(
        attn_cfg=dict(_delete_=True, type='linear', feature_map='elu+1')))
