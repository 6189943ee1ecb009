# The kernel study's token-attention backbone (tools/analysis/study.py, docs/study.md): PVTv2-b0 (overlapping conv
# patch embeddings, depthwise conv in the MLP; widths 32-64-160-256, depths 2-2-2-2, heads 1-2-5-8) without spatial
# reduction (sr_ratios 1-1-1-1, the InLine set-up: every stage attends over its whole token grid, queries = keys,
# no mask, so InLine's local residual and SOFT fit), GAP neck, linear head. The 32 px digit crops are scaled to 64 px
# (stage grids 16x16, 8x8, 4x4, 2x2: N = 256, 64, 16, 4 tokens); at 32 px the grids are 8, 4, 2, 1 and the model
# learns too little in the study's iterations. Recipe, schedule and AttentionStatsHook: those of the XCiT study config
# (study_xcit_t12_digits.py), so both backbones train under one recipe. 1 process (CPU) x 32 images.
_base_ = './study_xcit_t12_digits.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreePVTv2',
        arch='b0',
        sr_ratios=(1, 1, 1, 1),
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.0,
        out_indices=(3, ),
        init_cfg=dict(type='Scratch')),
    neck=dict(_delete_=True, type='GlobalAveragePooling'),
    head=dict(in_channels=256))

img_size = 64
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=img_size, crop_ratio_range=(0.7, 1.0), backend='pillow',
         interpolation='bicubic'),
    dict(type='PackInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=img_size, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=img_size),
    dict(type='PackInputs')
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
