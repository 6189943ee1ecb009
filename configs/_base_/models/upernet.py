# UperNet (+ auxiliary FCN head) for ADE20K, 150 classes: mmseg's model definition; each config replaces the backbone
# (`_delete_=True`) and sets the heads' input channels to the backbone's out_channels.
_base_ = 'mmseg::_base_/models/upernet_swin.py'

norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    data_preprocessor=dict(size=(512, 512)),
    backbone=dict(_delete_=True),
    decode_head=dict(num_classes=150, norm_cfg=norm_cfg),
    auxiliary_head=dict(num_classes=150, norm_cfg=norm_cfg))
