# ImageNet-1k at 224 with the DeiT / Swin augmentation (RandAugment, random erasing; mixup/cutmix live in the model's
# train_cfg). Layout: data/imagenet/{train,val}/..., data/imagenet/meta/{train,val}.txt ("relative/path.JPEG label")
dataset_type = 'ImageNet'
data_root = 'data/imagenet'
data_preprocessor = dict(num_classes=1000, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                         to_rgb=True)
bgr_mean = data_preprocessor['mean'][::-1]
bgr_std = data_preprocessor['std'][::-1]
img_size = 224
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=img_size, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandAugment', policies='timm_increasing', num_policies=2, total_level=10, magnitude_level=9,
         magnitude_std=0.5, hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic')),
    dict(type='RandomErasing', erase_prob=0.25, mode='rand', min_area_ratio=0.02, max_area_ratio=1 / 3,
         fill_color=bgr_mean, fill_std=bgr_std),
    dict(type='PackInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=int(img_size * 256 / 224), edge='short', backend='pillow',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=img_size),
    dict(type='PackInputs')
]
train_dataloader = dict(
    batch_size=128,  # images per GPU; the recipes use 8 GPUs (total batch 1024)
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='meta/train.txt', data_prefix='train',
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=64,
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='meta/val.txt', data_prefix='val',
                 pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
