"""The torch optimizers of the benchmarks' ``training.optimizer`` (``build_optimizer``): SGD, Adam, AdamW
and LARS.

LARS (layer-wise adaptive rate scaling; You, Gitman and Ginsburg, arXiv 1708.03888) is the
large-batch optimizer of MLPerf ResNet-50 submissions; torch ships none.

Per parameter tensor, with momentum m, weight decay wd and trust coefficient eta:

    trust = eta * ||w|| / (||g|| + wd * ||w||)      (1 where either norm is 0)
    v     = m * v + lr * trust * (g + wd * w)
    w     = w - v

As in the MLPerf reference, biases and BatchNorm parameters (1-D tensors) are left out of the
adaptation and of weight decay: ``lars_param_groups`` splits a model's parameters that way.
"""

from __future__ import annotations

import torch


class LARS(torch.optim.Optimizer):
    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, eta: float = 0.001):
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": eta, "adapt": True}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if group["adapt"]:
                    weight_norm = torch.linalg.vector_norm(param)
                    grad_norm = torch.linalg.vector_norm(grad)
                    denominator = grad_norm + group["weight_decay"] * weight_norm
                    trust = torch.where(
                        (weight_norm > 0) & (denominator > 0),
                        group["eta"] * weight_norm / denominator,
                        torch.ones_like(weight_norm),
                    )
                    grad = (grad + group["weight_decay"] * param) * trust
                buffer = self.state[param].get("momentum_buffer")
                if buffer is None:
                    buffer = self.state[param]["momentum_buffer"] = torch.zeros_like(param)
                buffer.mul_(group["momentum"]).add_(grad, alpha=group["lr"])
                param.sub_(buffer)
        return loss


def lars_param_groups(params) -> list[dict]:
    """Weights (adapted, decayed) and 1-D biases/BatchNorm parameters (plain momentum SGD, no decay)."""
    params = [param for param in params if param.requires_grad]
    return [
        {"params": [param for param in params if param.ndim > 1]},
        {"params": [param for param in params if param.ndim <= 1], "adapt": False, "weight_decay": 0.0},
    ]


def build_optimizer(params, optimizer: dict, lr: float) -> torch.optim.Optimizer:
    """The torch optimizer of a benchmark's ``training.optimizer`` config at peak learning rate ``lr``."""
    if optimizer["name"] == "sgd":
        return torch.optim.SGD(
            params,
            lr=lr,
            momentum=optimizer["momentum"],
            nesterov=optimizer["nesterov"],
            weight_decay=optimizer["weight_decay"],
        )
    if optimizer["name"] == "lars":
        return LARS(
            lars_param_groups(params),
            lr=lr,
            momentum=optimizer["momentum"],
            weight_decay=optimizer["weight_decay"],
            eta=optimizer["trust_coefficient"],
        )
    optimizer_class = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer["name"]]
    return optimizer_class(params, lr=lr, weight_decay=optimizer["weight_decay"])
