"""The model train.py trains: a small two-layer network (its own package, imported by train.py)."""

from __future__ import annotations

import torch
from torch import nn


class TinyRegressor(nn.Module):
    """features -> hidden -> 1, with a ReLU between."""

    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
