# The PyTorch baseline of `swelake bench train`: the same Llama-family model (RMSNorm, RoPE on
# adjacent pairs, grouped-query attention, SwiGLU, tied head), the same GRPO step (token-mean
# clipped objective, entropy statistic, global-norm clipping, AdamW) on the same batch shape.
# Prints one JSON line: {"tokens_per_s": ..., "step_s": ...}.
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

cfg = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(cfg["threads"])
V, D, L, H, KV, HID = cfg["vocab"], cfg["dim"], cfg["layers"], cfg["heads"], cfg["kv_heads"], cfg["hidden"]
HD = D // H
B, T, STEPS, MIN_S = cfg["batch"], cfg["seq_len"], cfg["steps"], cfg["min_seconds"]


def p(*shape):
    return torch.nn.Parameter(torch.randn(*shape) * 0.02)


params = {"embed": p(V, D), "norm": torch.nn.Parameter(torch.ones(D))}
for i in range(L):
    params.update({
        f"{i}.an": torch.nn.Parameter(torch.ones(D)), f"{i}.fn": torch.nn.Parameter(torch.ones(D)),
        f"{i}.wq": p(H * HD, D), f"{i}.wk": p(KV * HD, D), f"{i}.wv": p(KV * HD, D), f"{i}.wo": p(D, H * HD),
        f"{i}.wg": p(HID, D), f"{i}.wu": p(HID, D), f"{i}.wd": p(D, HID),
    })

freq = cfg["rope_theta"] ** (-2.0 * torch.arange(HD // 2) / HD)
ang = torch.arange(T)[:, None] * freq[None, :]
cos, sin = ang.cos(), ang.sin()
mask = torch.full((T, T), -1e9).triu(1)


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["eps"]) * w


def rope(x):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)


def forward(tok):
    x = params["embed"][tok]
    for i in range(L):
        h = rms(x, params[f"{i}.an"])
        q = rope((h @ params[f"{i}.wq"].T).view(B, T, H, HD).transpose(1, 2))
        k = rope((h @ params[f"{i}.wk"].T).view(B, T, KV, HD).transpose(1, 2))
        v = (h @ params[f"{i}.wv"].T).view(B, T, KV, HD).transpose(1, 2)
        k = k.repeat_interleave(H // KV, 1)
        v = v.repeat_interleave(H // KV, 1)
        s = q @ k.transpose(-1, -2) / math.sqrt(HD) + mask
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        x = x + a @ params[f"{i}.wo"].T
        h = rms(x, params[f"{i}.fn"])
        x = x + (F.silu(h @ params[f"{i}.wg"].T) * (h @ params[f"{i}.wu"].T)) @ params[f"{i}.wd"].T
    # The head only where there are completion tokens, as the Rust step does: prompt
    # positions' logits are never used.
    return rms(x[:, T // 2:], params["norm"]) @ params["embed"].T


opt = torch.optim.AdamW(params.values(), lr=1e-5, weight_decay=0.01)
tokens = torch.randint(0, V, (B, T + 1))
inp, tgt = tokens[:, :-1], tokens[:, 1 + T // 2:]
comp = torch.ones(B, T - T // 2)
adv = torch.tensor([1.0 if b % 2 == 0 else -1.0 for b in range(B)])[:, None]


def step():
    logits = forward(inp)
    lp_all = logits.log_softmax(-1)
    lp = lp_all.gather(-1, tgt[..., None]).squeeze(-1)
    ratio = (lp - lp.detach()).exp()
    surr = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
    loss = -(surr * comp).sum() / comp.sum()
    with torch.no_grad():
        _ = -((lp_all.exp() * lp_all).sum(-1) * comp).sum()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
    opt.step()


step()
# At least STEPS steps and MIN_S seconds (the same rule as the Rust side).
t0 = time.perf_counter()
done = 0
while done < STEPS or time.perf_counter() - t0 < MIN_S:
    step()
    done += 1
dt = (time.perf_counter() - t0) / done
print(json.dumps({"tokens_per_s": B * T / dt, "step_s": dt}))
