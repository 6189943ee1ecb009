# The task study's segmentor at the classifier's token count (tools/analysis/task_study.py, layout pvt_n64;
# docs/study.md, "Why x^3 / sqrt(N) collapses in segmentation"): semfpn_pvt_v2_b0_digits.py with every forward of
# the backbone over the token counts its classifier trained at (study_pvt_v2_b0_digits.py: 64 px, N = 256, 64, 16, 4
# per stage) instead of 4x as many: training crops of 64 instead of 128, and at test sliding 64 px windows (stride
# 48) over the scenes instead of one forward over the whole 160 x 128 scene. The scenes' scale, the schedule (3000
# iterations), the batch and the optimiser are unchanged. The study sets attn_cfg per run. 1 process (CPU) x 4 images.
_base_ = './semfpn_pvt_v2_b0_digits.py'
crop_size = (64, 64)
model = dict(data_preprocessor=dict(size=crop_size),
             test_cfg=dict(_delete_=True, mode='slide', crop_size=crop_size, stride=(48, 48)))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(160, 128), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='PackSegInputs')
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
