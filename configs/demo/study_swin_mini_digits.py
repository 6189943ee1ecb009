# The kernel study's token-attention backbone (tools/analysis/study.py, docs/study.md): a demo-sized Swin (embed 32,
# depths 2-2-2, heads 1-2-4: head dim 32) whose every stage attends over its whole token grid (global_window=True,
# the InLine paper's set-up: no windows, no shift, no padding, no mask, no relative position bias, so InLine and
# SOFT fit and every kernel sees the same layer). Patch size 2 on the 32 px digit crops: stage grids 16x16, 8x8, 4x4
# (N = 256, 64, 16 tokens), GAP neck, linear head. Data, recipe, schedule and AttentionStatsHook: those of the XCiT
# study config (study_xcit_t12_digits.py), so both backbones train under one recipe. 1 process (CPU) x 32 images.
_base_ = './study_xcit_t12_digits.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreeSwin',
        arch=dict(embed_dims=32, depths=(2, 2, 2), num_heads=(1, 2, 4)),
        patch_size=2,
        attn_cfg=dict(type='softmax'),
        global_window=True,
        drop_path_rate=0.0,
        out_indices=(2, ),
        init_cfg=dict(type='Scratch')),
    neck=dict(_delete_=True, type='GlobalAveragePooling'),
    head=dict(in_channels=128))
