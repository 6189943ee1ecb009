# The windowed layout of the warm-start grid (tools/analysis/warm_start_grid.py, docs/warm_start.md): a tiny Swin
# (widths 32-64-128-256, depths 2-2-2-2, heads 1-2-4-8: head width 32, as the PVTv2 study backbone's) with 4x4 windows
# that really tile the grid. The 32 px digit crops are scaled to 64 px as for PVTv2 (patch 4: stage grids 16x16,
# 8x8, 4x4, 2x2): stage 1 holds 4 x 4 windows, stage 2 2 x 2, both with shifted blocks (rolled by 2, the joined
# regions masked) and the relative position bias; stage 3 is one 4x4 window (no padding; no shift, the grid is one
# window); stage 4 attends over its whole 2x2 grid (global_window: a 4x4 window there would be three quarters
# padding). tests/models/test_backbones_swin.py checks this geometry. Recipe, schedule and AttentionStatsHook: the
# study's (study_xcit_t12_digits.py). 1 process (CPU) x 32 images.
# Its convolutions are PVTv2-b0's (downsample='conv': the overlapping 3x3 stride-2 patch embedding between stages;
# mlp='dwconv' with PVTv2-b0's mlp_ratio 8), initialised as PVTv2's (normal, std sqrt(2 / fan_out)): what differs
# from the token layout's PVTv2-b0 is the attention (windows, shifts, relative position bias), Swin's 4x4 patch stem
# and a third stage of 128 channels (PVTv2-b0: 160). A plain Swin (ours or mmpretrain's: patch merging, a linear MLP)
# stays at chance with softmax in the study's 300 iterations (so do 2x2 patches, global windows, an overlapping 7x7
# stem, one block a stage, lr 3e-4 or 2e-3), and so did this one with torch's conv initialisation; with PVTv2's it
# leaves the loss plateau as early as PVTv2-b0 does (its from-scratch rows: docs/results/warm_start/classifiers.csv).
_base_ = './study_pvt_v2_b0_digits.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreeSwin',
        arch=dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)),
        window_size=4,
        downsample='conv',
        mlp='dwconv',
        mlp_ratio=8.0,
        global_window=(False, False, False, True),
        attn_cfg=dict(type='softmax'),
        drop_path_rate=0.0,
        out_indices=(3, ),
        init_cfg=dict(type='Scratch')),
    head=dict(in_channels=256))
