"""A transposed convolution whose kernel equals its stride, as one matrix product on the CPU (XCiT's adapter)."""
import torch
from torch import nn


class BlockDeconv(nn.ConvTranspose2d):
    """``nn.ConvTranspose2d`` (same parameters and state-dict keys) computed as one matrix product on the CPU where
    its kernel equals its stride (the adapter's 2x2, stride 2): every input pixel then writes its own k x k output
    block, a linear map C_in -> C_out * k * k per pixel (bias inside the product), then one copy interleaves the
    blocks into a contiguous NCHW output (as mmcv's CPU RoIAlign reads it). NCHW and channels-last inputs are read
    without a copy; other geometries and devices take ``nn.ConvTranspose2d``'s own path (slower on the CPU)."""

    def _blockwise(self, x) -> bool:
        return (x.device.type == 'cpu' and x.dim() == 4 and tuple(self.kernel_size) == tuple(self.stride)
                and not any(self.padding) and not any(self.output_padding) and tuple(self.dilation) == (1, 1)
                and self.groups == 1 and self.padding_mode == 'zeros')

    def forward(self, x, output_size=None):
        if output_size is not None or not self._blockwise(x):
            return super().forward(x, output_size)
        b, c, h, w = x.shape
        kh, kw = self.kernel_size
        cout = self.out_channels
        if not x.is_contiguous() and x.permute(0, 2, 3, 1).is_contiguous():
            # channels-last input (the blocks' tokens seen as a grid): its pixels are already the rows of a
            # (B*H*W, C_in) matrix, so no copy of the input is made (nor kept for backward)
            wt = self.weight.reshape(c, cout * kh * kw)  # columns ordered (channel, row offset, column offset)
            pix = x.permute(0, 2, 3, 1).reshape(b * h * w, c)
            y = pix @ wt if self.bias is None else torch.addmm(self.bias.repeat_interleave(kh * kw), pix, wt)
            # (B, H, W, C_out, kh, kw) -> (B, C_out, H, kh, W, kw): one copy into NCHW order
            return y.view(b, h, w, cout, kh, kw).permute(0, 3, 1, 4, 2, 5).reshape(b, cout, h * kh, w * kw)
        # weight (C_in, C_out, kh, kw) -> (C_out * kh * kw, C_in): rows ordered (channel, row offset, column offset)
        wt = self.weight.permute(1, 2, 3, 0).reshape(cout * kh * kw, c)
        pix = x.reshape(b, c, h * w)
        if self.bias is None:
            y = wt @ pix[0] if b == 1 else torch.bmm(wt.expand(b, -1, -1), pix)  # (matmul would copy pix)
        else:
            rows = self.bias.repeat_interleave(kh * kw)[:, None]
            y = torch.addmm(rows, wt, pix[0])[None] if b == 1 else torch.baddbmm(rows, wt.expand(b, -1, -1), pix)
        # (B, C_out, kh, kw, H, W) -> (B, C_out, H, kh, W, kw): one copy into NCHW order
        return y.view(b, cout, kh, kw, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, cout, h * kh, w * kw)
