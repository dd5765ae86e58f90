"""LARS against a hand computation of its update rule, and its parameter groups."""

import torch

from mlcampaign.trial.torch.optim import LARS, lars_param_groups


def test_lars_step_matches_the_update_rule():
    weight = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))  # ||w|| = 5
    weight.grad = torch.tensor([[0.6, 0.8]])  # ||g|| = 1
    lr, momentum, wd, eta = 0.1, 0.9, 0.01, 0.002
    optimizer = LARS([weight], lr=lr, momentum=momentum, weight_decay=wd, eta=eta)
    trust = eta * 5.0 / (1.0 + wd * 5.0)
    first = lr * trust * (torch.tensor([[0.6, 0.8]]) + wd * torch.tensor([[3.0, 4.0]]))
    optimizer.step()
    expected = torch.tensor([[3.0, 4.0]]) - first
    assert torch.allclose(weight.detach(), expected)
    # The second step carries momentum.
    before = weight.detach().clone()
    optimizer.step()
    trust = eta * before.norm() / (1.0 + wd * before.norm())
    second = momentum * first + lr * trust * (torch.tensor([[0.6, 0.8]]) + wd * before)
    assert torch.allclose(weight.detach(), before - second)


def test_biases_and_batchnorm_are_not_adapted_or_decayed():
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    adapted, plain = lars_param_groups(model.parameters())
    assert [p.ndim for p in adapted["params"]] == [4]
    assert all(p.ndim == 1 for p in plain["params"])
    assert plain["adapt"] is False and plain["weight_decay"] == 0.0
    bias = torch.nn.Parameter(torch.ones(2))
    bias.grad = torch.ones(2)
    LARS([{"params": [bias], "adapt": False, "weight_decay": 0.0}], lr=0.5, weight_decay=0.1).step()
    assert torch.allclose(bias.detach(), torch.full((2,), 0.5))  # plain SGD step


def test_zero_weights_fall_back_to_plain_steps():
    weight = torch.nn.Parameter(torch.zeros(2, 2))
    weight.grad = torch.ones(2, 2)
    LARS([weight], lr=0.1).step()
    assert torch.allclose(weight.detach(), torch.full((2, 2), -0.1))
