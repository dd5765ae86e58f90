"""CosmoFlow: a 3D CNN regressing four cosmological parameters from dark-matter density cubes.

The MLPerf HPC reference (mlcommons/hpc, cosmoflow/models/cosmoflow.py and configs/cosmo.yaml):
``n_conv_layers`` x [Conv3d 'same' -> LeakyReLU(0.3) -> MaxPool 2] with ``base_filters`` x 2^i
filters, flatten -> Dense ``fc1_size`` -> Dense ``fc2_size`` (each LeakyReLU(0.3) + Dropout)
-> Dense 4 -> tanh x 1.2. Weights start Glorot-uniform with zero biases (the Keras defaults of
the reference). Input: 4 redshift channels of ``input_size``^3 voxels, ``log1p`` of int16
particle counts (applied by the reader); loss MSE; quality: validation mean absolute error.

Options: ``input_size`` (128 at MLPerf spec; any multiple of 2^n_conv_layers), ``base_filters``
(32), ``n_conv_layers`` (5), ``kernel_size`` (3, as in EPCC's PyTorch port; the Keras builder
falls back to 2 when a config leaves it unset), ``fc1_size`` (128), ``fc2_size`` (64),
``dropout`` (0.5), ``target_size`` (4).
"""

from __future__ import annotations

import torch
from torch import nn

from mlcampaign.trial.torch.models import ModelSpec

IN_CHANNELS = 4  # redshifts of the simulated universe
LEAKY_SLOPE = 0.3  # Keras LeakyReLU default, used by the reference
OUTPUT_SCALE = 1.2  # tanh x 1.2 covers the normalised parameter range


def check_input_size(input_size: int, n_conv_layers: int) -> None:
    """Each conv block halves the cube, so the input must divide by 2^n_conv_layers (both frameworks)."""
    if input_size % 2**n_conv_layers:
        raise ValueError(
            f"model option input_size={input_size} must be divisible by 2^n_conv_layers = {2**n_conv_layers}"
        )


class CosmoFlow(nn.Module):
    def __init__(
        self,
        input_size: int = 128,
        base_filters: int = 32,
        n_conv_layers: int = 5,
        kernel_size: int = 3,
        fc1_size: int = 128,
        fc2_size: int = 64,
        dropout: float = 0.5,
        target_size: int = 4,
    ):
        super().__init__()
        check_input_size(input_size, n_conv_layers)
        layers: list[nn.Module] = []
        channels = IN_CHANNELS
        for index in range(n_conv_layers):
            filters = base_filters * 2**index
            layers += [
                nn.Conv3d(channels, filters, kernel_size, padding="same"),
                nn.LeakyReLU(LEAKY_SLOPE),
                nn.MaxPool3d(2),
            ]
            channels = filters
        flat = channels * (input_size // 2**n_conv_layers) ** 3
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, fc1_size),
            nn.LeakyReLU(LEAKY_SLOPE),
            nn.Dropout(dropout),
            nn.Linear(fc1_size, fc2_size),
            nn.LeakyReLU(LEAKY_SLOPE),
            nn.Dropout(dropout),
            nn.Linear(fc2_size, target_size),
            nn.Tanh(),
        )
        for module in self.modules():
            if isinstance(module, (nn.Conv3d, nn.Linear)):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x)) * OUTPUT_SCALE


def sample_shape(input_size: int = 128, **_: object) -> tuple[int, ...]:
    return (IN_CHANNELS, input_size, input_size, input_size)


def criterion(training: dict) -> nn.Module:
    return nn.MSELoss()


def eval_sums(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Absolute error summed over samples and parameters (Keras' 'mae' averages over both)."""
    return {
        "abs_error": (outputs - targets).abs().sum().to(torch.float64),
        "count": torch.tensor(float(targets.numel()), dtype=torch.float64),
    }


def eval_finalize(sums: dict[str, float]) -> dict[str, float]:
    return {"mae": sums["abs_error"] / sums["count"]}


def example_targets(batch: int, shape: tuple[int, ...], device: str = "cpu") -> torch.Tensor:
    return torch.zeros(batch, 4, device=device)


SPEC = ModelSpec(
    build=CosmoFlow,
    sample_shape=sample_shape,
    criterion=criterion,
    eval_sums=eval_sums,
    eval_finalize=eval_finalize,
    example_targets=example_targets,
)
