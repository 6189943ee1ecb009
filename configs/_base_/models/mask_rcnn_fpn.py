# Mask R-CNN + FPN: mmdet's own model definition; each config replaces the backbone (`_delete_=True`) and sets the
# FPN input channels to the backbone's out_channels.
_base_ = 'mmdet::_base_/models/mask-rcnn_r50_fpn.py'
