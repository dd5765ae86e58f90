"""Trial seeds: derived from the campaign seed and the trial's coordinates, then applied everywhere.

Formula (documented in the README):

    seed = int.from_bytes(sha256(f"{campaign_seed}/{benchmark}/{trial}").digest()[:4], "big")

The seed deliberately leaves out system, scale and precision: trial k of a benchmark starts
from the same weights and sees the same data order on every system and scale, so comparisons
between systems are paired rather than confounded by seed variance.
"""

from __future__ import annotations

import hashlib
import os
import random

import numpy as np


def derive_seed(campaign_seed: int, benchmark: str, trial: int) -> int:
    """A 32-bit seed for trial ``trial`` of ``benchmark`` in a campaign seeded with ``campaign_seed``."""
    key = f"{campaign_seed}/{benchmark}/{trial}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch; optionally force deterministic torch algorithms."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS needs a fixed workspace for deterministic matmuls; harmless on CPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
