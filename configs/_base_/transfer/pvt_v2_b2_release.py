# The official softmax ImageNet classifier the warm start of pvt_v2_b2 starts from: stage 1's teacher, stage 2's head
cls_release = 'https://github.com/whai362/PVT/releases/download/v2/pvt_v2_b2.pth'
