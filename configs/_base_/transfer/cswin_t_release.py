# The official softmax ImageNet classifier the warm start of cswin_t starts from: stage 1's teacher, stage 2's head
cls_release = 'https://github.com/microsoft/CSWin-Transformer/releases/download/v0.1.0/cswin_tiny_224.pth'
