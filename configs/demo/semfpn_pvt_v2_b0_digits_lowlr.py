# The collapse's arm 1 (tools/analysis/task_study.py, layout pvt_lowlr; docs/study.md, "The collapse's arms with
# controls that train"): semfpn_pvt_v2_b0_digits.py with the backbone at a tenth of the segmentor's lr (1e-4; the neck
# and head keep 1e-3) and gradient clipping at a norm of 5, as the study's classifier clips
# (study_pvt_v2_b0_digits.py). Everything else unchanged: crops of 128, 3000 iterations, the batch, the schedule.
# The study sets attn_cfg per run. 1 process (CPU) x 4 images.
_base_ = './semfpn_pvt_v2_b0_digits.py'
optim_wrapper = dict(
    clip_grad=dict(max_norm=5.0, norm_type=2),
    # 'backbone' is a substring of every backbone parameter's name; PVTv2 has none of the base's longer keys
    # (pos_embed, ...), which would win the match and drop the multiplier (a test checks every backbone parameter)
    paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.1)}))
