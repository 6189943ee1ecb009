"""What two or more backbones share beside the kit: config expansion, windows, tokens, the MLP, pretrained loading."""
