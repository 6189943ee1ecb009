# The official softmax ImageNet classifier the warm start of swin_t starts from: stage 1's teacher, stage 2's head
cls_release = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth'
