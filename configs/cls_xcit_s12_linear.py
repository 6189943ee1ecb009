# cls / xcit_s12: linear attention, feature map elu+1 (linear attention, Katharopoulos et al. 2020; linear cost; masks honoured in shifted/padded windows).
# Everything else (recipe, GPUs x images per GPU, schedule) is cls_xcit_s12_softmax.py.
# Reported: no number in the anchors for this combination; compare with the softmax baseline.
_base_ = './cls_xcit_s12_softmax.py'
model = dict(
    backbone=dict(
        attn_cfg=dict(_delete_=True, type='linear', feature_map='elu+1')))
