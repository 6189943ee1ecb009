# Semantic FPN (Kirillov et al. 2019) for ADE20K, 150 classes: mmseg's FPN model; each config replaces the backbone
# (`_delete_=True`) and sets the neck's input channels to the backbone's out_channels.
_base_ = 'mmseg::_base_/models/fpn_r50.py'

model = dict(
    data_preprocessor=dict(size=(512, 512)),
    backbone=dict(_delete_=True),
    pretrained=None,
    neck=dict(out_channels=256, num_outs=4),
    decode_head=dict(num_classes=150, dropout_ratio=0.1))
