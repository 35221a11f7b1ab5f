"""Greedy decoding's linear layers on the CPU, computed the way that reads the weights fastest.

A decoding step of a batch of probes multiplies a few rows (one new token
per probe) by every weight matrix of the model: it reads the weights, ~540
MB for SmolLM2-135M in float32, and does little else. ``F.linear(x, W)``
(``x @ W.T``) takes oneDNN/MKL's path for a thin left operand, which for 2
to 4 rows reads the weights at a third of the speed of one row; the same
product written as ``(W @ x.T).T`` (the weight as the left operand, in its
own row-major layout) reads them at memory speed. Measured on the 2-core
machine with torch 2.13's MKL, ``F.linear`` time over ``W @ x.T`` time for
SmolLM2-135M's shapes (two threads; 1 row is 1.0x for every shape):

============  =====  =====  =====  =====  =====
rows          2      3      4      6      8
============  =====  =====  =====  =====  =====
q_proj/o      2.8x   2.7x   1.8x   1.7x   1.4x
k/v_proj      3.4x   4.2x   3.2x   1.4x   1.3x
gate/up       3.3x   4.7x   2.7x   1.7x   1.2x
down          2.9x   1.9x   1.2x   0.8x   0.6x
lm_head       6.1x   8.9x   3.1x   3.2x   2.2x
============  =====  =====  =====  =====  =====

so :func:`few_row_linears` computes every ``torch.nn.Linear`` of a model
(peft's LoRA layers call theirs) as ``W @ x.T`` when its input holds
:data:`FEW_ROWS` rows, and as before otherwise (the prompts' forward pass,
the val loss, training). The two orders of the same sums can differ in a
float's last bits, like a batch's padding does (``dlmstore.eval.inference``);
the same model asked the same probes always gives the same answers.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The row counts (tokens in the batch) computed weight-first: where the table above gains for every shape.
FEW_ROWS = range(2, 5)


def _forward(self: Any, x: Any) -> Any:
    import torch

    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    if rows not in FEW_ROWS or x.device.type != "cpu" or x.dtype != self.weight.dtype:
        return torch.nn.functional.linear(x, self.weight, self.bias)
    out = torch.mm(self.weight, x.reshape(rows, width).t()).t().contiguous()
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], self.weight.shape[0])


@contextmanager
def few_row_linears(model: Any) -> Iterator[None]:
    """Within the block, ``model``'s ``torch.nn.Linear`` layers compute inputs of few rows weight-first."""
    import torch

    # a layer whose forward was already replaced (accelerate's hooks for a model spread over devices) is left be
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in vars(m)]
    for layer in layers:
        layer.forward = types.MethodType(_forward, layer)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for layer in layers:
            vars(layer).pop("forward", None)
