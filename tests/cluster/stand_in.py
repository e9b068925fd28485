"""A device stand-in: a torch op whose forward and backward sleep for set times, as a host
waits for a GPU kernel. The cores stay free for communication (gloo reduces and copies on the
same two cores the ranks run on), so a recording's compute does not move with its network.

``Layer(param_bytes, forward_ms, backward_ms)`` holds a parameter (its gradient is what a
data-parallel step all-reduces) and passes its input through; its backward returns a zero
gradient for the parameter, made once per layer."""

from __future__ import annotations

import time

import torch
from torch import nn

_LIB = "chakra_testbed"


@torch.library.custom_op(f"{_LIB}::device_sleep", mutates_args=())
def device_sleep(x: torch.Tensor, weight: torch.Tensor, forward_ms: float,
                 backward_ms: float) -> torch.Tensor:
    time.sleep(forward_ms / 1e3)
    return x.clone()


@device_sleep.register_fake
def _(x, weight, forward_ms, backward_ms):
    return torch.empty_like(x)


@torch.library.custom_op(f"{_LIB}::device_sleep_backward", mutates_args=())
def device_sleep_backward(grad: torch.Tensor, weight: torch.Tensor,
                          backward_ms: float) -> tuple[torch.Tensor, torch.Tensor]:
    time.sleep(backward_ms / 1e3)
    return grad.clone(), torch.zeros_like(weight)


@device_sleep_backward.register_fake
def _(grad, weight, backward_ms):
    return torch.empty_like(grad), torch.empty_like(weight)


def _setup(ctx, inputs, output) -> None:
    _, weight, _, backward_ms = inputs
    ctx.save_for_backward(weight)
    ctx.backward_ms = backward_ms


def _backward(ctx, grad):
    (weight,) = ctx.saved_tensors
    grad_x, grad_w = device_sleep_backward(grad, weight, ctx.backward_ms)
    return grad_x, grad_w, None, None


device_sleep.register_autograd(_backward, setup_context=_setup)


class Layer(nn.Module):
    """A layer whose compute is ``forward_ms`` / ``backward_ms`` of sleep (``scale`` times
    them: a straggler), with a parameter of ``param_bytes``."""

    def __init__(self, param_bytes: int, forward_ms: float, backward_ms: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max(1, param_bytes // 4)))
        self.forward_ms, self.backward_ms = forward_ms, backward_ms
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return device_sleep(x, self.weight, self.forward_ms * self.scale,
                            self.backward_ms * self.scale)
