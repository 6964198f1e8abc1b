"""The demo's data: scikit-learn's bundled handwritten digits (no download), with a
held-out test set and deterministic shift+noise augmentation to make epochs long enough."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TRAIN_BASE = 1500  # digits 0..1499 feed training; 1500..1796 are the test set


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0  # (1797, 8, 8)
    labels = torch.tensor(digits.target, dtype=torch.long)
    return images, labels


def augmented_train_set(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample id i is base digit i % 1500, shifted by one of 9 offsets chosen by its copy
    number, plus seeded noise: every id maps to one fixed (x, y)."""
    import torch

    images, labels = load_digits_tensors()
    ids = torch.arange(size)
    base = ids % TRAIN_BASE
    copy = ids // TRAIN_BASE
    x = images[base].clone()
    for offset in range(9):
        rows = (copy % 9) == offset
        dy, dx = offset // 3 - 1, offset % 3 - 1
        x[rows] = torch.roll(x[rows], shifts=(dy, dx), dims=(1, 2))
    gen = torch.Generator().manual_seed(seed)
    noise = 0.05 * torch.randn(x.shape, generator=gen)
    x = (x + noise * (copy > 0).float().view(-1, 1, 1)).reshape(size, 64)
    return x, labels[base]


def test_set() -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = load_digits_tensors()
    return images[TRAIN_BASE:].reshape(-1, 64), labels[TRAIN_BASE:]
