"""Models of the lab's tasks. Each takes ``act``: a zero-argument factory of activation modules,
called once per activation layer, so every layer gets its own module (and its own λ)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn as nn

ActFactory = Callable[[], nn.Module]


class MLP(nn.Sequential):
    """Flatten → [Linear → act] × len(hidden) → Linear."""

    def __init__(self, in_features: int, hidden: Sequence[int], num_classes: int, act: ActFactory):
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), act()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), then x + MLP(LN(x)) with the activation inside."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, act: ActFactory, dropout: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), act(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class BasicBlock(nn.Module):
    """CIFAR-style residual block: conv-BN-act-conv-BN, plus the (projected) input, then act."""

    def __init__(self, cin: int, cout: int, stride: int, act: ActFactory):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.act1 = act()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.act2 = act()
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = self.act1(self.bn1(self.conv1(x)))
        return self.act2(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet(nn.Module):
    """A CIFAR-style ResNet (He et al. 2016, §4.2) narrowed for CPU: stem, one block per stage."""

    def __init__(self, in_channels: int, num_classes: int, act: ActFactory, widths=(16, 32, 64)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), act())
        stages, cin = [], widths[0]
        for i, w in enumerate(widths):
            stages.append(BasicBlock(cin, w, 1 if i == 0 else 2, act))
            cin = w
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


class ViT(nn.Module):
    """A small ViT/DeiT-style classifier: patch embedding, class token, pre-norm blocks, GELU MLPs."""

    def __init__(self, image_size: int, patch: int, in_channels: int, num_classes: int, act: ActFactory,
                 dim: int = 64, depth: int = 4, heads: int = 4, mlp_ratio: int = 2):
        super().__init__()
        n = (image_size // patch) ** 2
        self.embed = nn.Conv2d(in_channels, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, mlp_ratio, act) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        h = self.embed(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(len(h), -1, -1), h], 1) + self.pos
        return self.head(self.norm(self.blocks(h))[:, 0])


class ByteGPT(nn.Module):
    """Hugging Face's GPT-2 over bytes (vocabulary 256), returning logits. Its ``gelu_new`` activations
    are replaced by ``act()`` unless ``act`` is the GELU default."""

    def __init__(self, act: ActFactory, context: int = 64, dim: int = 96, layers: int = 3, heads: int = 4):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        import lambda_gelu as lg
        config = GPT2Config(vocab_size=256, n_positions=context, n_embd=dim, n_layer=layers, n_head=heads,
                            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=0, eos_token_id=0)
        self.gpt = GPT2LMHeadModel(config)
        if act is not nn.GELU:
            lg.replace_modules_(self.gpt, lambda m, fqn: lg.is_gelu_like(m), lambda m: act(), "GELU")

    def forward(self, x):
        return self.gpt(input_ids=x).logits
