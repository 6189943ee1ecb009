# ImageNet-1k classifier (mmpretrain): backbone -> global average pooling (or XCiT's class token) -> linear head,
# label smoothing 0.1, Mixup 0.8 / CutMix 1.0 (the DeiT / Swin recipe).
model = dict(
    type='ImageClassifier',
    backbone=dict(),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(type='LinearClsHead', num_classes=1000, in_channels=768,
              loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
              init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.), topk=(1, 5)),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))
