# The official softmax ImageNet classifier the warm start of xcit_s12 starts from: stage 1's teacher, stage 2's head
cls_release = 'https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_224.pth'
