"""Padded SDPA with a key-padding mask and dropout on CUDA: is the mask honoured, is dropout unbiased?"""

import torch
import torch.nn.functional as F

torch.manual_seed(0)
dev = "cuda"
for dtype in (torch.bfloat16, torch.float32):
    B, H, L, D = 8, 4, 128, 64
    lengths = torch.randint(20, L + 1, (B,), device=dev)
    mask = (torch.arange(L, device=dev)[None, :] < lengths[:, None])[:, None, None, :]
    q, k, v = (torch.randn(B, H, L, D, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    # mask honoured with dropout: same seed, values at padded keys changed -> same output?
    v2 = v.detach().clone()
    pad = ~mask[:, 0, 0, :]
    v2[pad.nonzero(as_tuple=True)[0], :, pad.nonzero(as_tuple=True)[1]] = 100.0
    torch.manual_seed(1)
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)
    torch.manual_seed(1)
    b = F.scaled_dot_product_attention(q, k, v2, attn_mask=mask, dropout_p=0.1)
    print(dtype, "mask honoured with dropout: max |a-b| =", (a - b).abs().max().item())
    n = 200
    acc = torch.zeros_like(ref, dtype=torch.float32)
    for _ in range(n):
        acc += F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1).float()
    valid = mask[:, 0, 0, :][:, None, :, None].expand_as(ref)
    err = ((acc / n - ref.float()).abs()[valid]).mean().item()
    scale = ref.float().abs()[valid].mean().item()
    print(dtype, f"dropout mean vs no-dropout: mean abs err {err:.4f} of mean |ref| {scale:.4f}")
    # the gradient: the mean over dropout draws against the gradient without dropout
    g = torch.randn_like(ref)
    (gq_ref,) = torch.autograd.grad(ref, q, g, retain_graph=True)
    gacc = torch.zeros_like(q, dtype=torch.float32)
    for _ in range(n):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)
        (gq,) = torch.autograd.grad(o, q, g)
        gacc += gq.float()
    gerr = ((gacc / n - gq_ref.float()).abs()[valid]).mean().item()
    gscale = gq_ref.float().abs()[valid].mean().item()
    print(dtype, f"dq mean with dropout vs without: mean abs err {gerr:.4f} of mean |dq| {gscale:.4f}")
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        gacc.zero_()
        for _ in range(n):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)
            (gq,) = torch.autograd.grad(o, q, g)
            gacc += gq.float()
    gerr = ((gacc / n - gq_ref.float()).abs()[valid]).mean().item()
    print(dtype, f"MATH backend: dq mean with dropout vs without: mean abs err {gerr:.4f} of mean |dq| {gscale:.4f}")
