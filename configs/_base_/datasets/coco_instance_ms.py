# COCO 2017 instance segmentation with the 3x multi-scale + crop augmentation (DETR / Swin / XCiT / PVTv2 / CSwin
# detection recipes). Layout: data/coco/{train2017,val2017}/*.jpg, data/coco/annotations/instances_{split}.json
dataset_type = 'CocoDataset'
data_root = 'data/coco/'
backend_args = None
ms_scales = [(480, 1333), (512, 1333), (544, 1333), (576, 1333), (608, 1333), (640, 1333),
             (672, 1333), (704, 1333), (736, 1333), (768, 1333), (800, 1333)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomChoice', transforms=[
        [dict(type='RandomChoiceResize', scales=ms_scales, keep_ratio=True)],
        [dict(type='RandomChoiceResize', scales=[(400, 1333), (500, 1333), (600, 1333)], keep_ratio=True),
         dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600), allow_negative_crop=True),
         dict(type='RandomChoiceResize', scales=ms_scales, keep_ratio=True)]]),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(1333, 800), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(
    batch_size=2,  # images per GPU; the recipes use 8 GPUs (total batch 16)
    num_workers=4,  # multi-scale 1333 px with masks: 2 workers starve a current GPU
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='annotations/instances_train2017.json',
                 data_prefix=dict(img='train2017/'), filter_cfg=dict(filter_empty_gt=True, min_size=32),
                 pipeline=train_pipeline, backend_args=backend_args))
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='annotations/instances_val2017.json',
                 data_prefix=dict(img='val2017/'), test_mode=True, pipeline=test_pipeline,
                 backend_args=backend_args))
test_dataloader = val_dataloader
val_evaluator = dict(type='CocoMetric', ann_file=data_root + 'annotations/instances_val2017.json',
                     metric=['bbox', 'segm'], format_only=False, backend_args=backend_args)
test_evaluator = val_evaluator
