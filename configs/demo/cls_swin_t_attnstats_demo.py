# CPU demo of AttentionStatsHook (softfree_mm/engine/hooks/attention_stats.py): Swin-T with poly3 attention (x^3 / sqrt(N)
# in every window) trained on the digits classification demo; every 10 iterations (and at the first) the hook writes
# ||A||_F and the score-Jacobian norm of every attention layer and head to work_dir/<run>/vis_data/attention_stats.json
# (and to TensorBoard when vis_backends has TensorboardVisBackend). Plot: tools/analysis/plot_attention_stats.py.
# Data, pipelines and schedule: those of the XCiT classification demo (cls_xcit_s12_poly3_demo.py); the model:
# configs/cls_swin_t_poly3.py's (Swin-T, 7x7 windows, GAP neck, linear head). 1 process (CPU) x 32 images.
_base_ = './cls_xcit_s12_poly3_demo.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SoftFreeSwin',
        arch='tiny',
        attn_cfg=dict(type='poly', degree=3),
        drop_path_rate=0.2,
        out_indices=(3, ),
        init_cfg=dict(type='Scratch')),  # from scratch, as the classification configs
    neck=dict(_delete_=True, type='GlobalAveragePooling'),
    head=dict(in_channels=768))
custom_hooks = [dict(type='AttentionStatsHook', interval=10)]
