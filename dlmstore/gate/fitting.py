"""Fitting the gate: a small MLP from a prompt embedding to one weight per adapter.

The shape and the loss are DLM's (``dlm.train.gate``):

    Linear(input_dim -> hidden_proj_dim) -> GELU -> Linear(hidden_proj_dim -> n) -> softmax

trained with AdamW on the cross-entropy of each prompt's adapter label
minus ``entropy_lambda`` times the mean Shannon entropy of the softmax: the
entropy term pays the gate for staying spread out, so it does not collapse
onto one adapter. Batches of 16 are drawn as DLM draws them, a fresh seeded
permutation of the prompts whenever the last one runs out.

**Cold start.** When an adapter has fewer prompts than
``training.gate.cold_start_floor``, a fitted gate would learn that adapter
from almost nothing; as in DLM, nothing is fitted and the gate routes
uniformly (``1/n`` each), with a note saying which adapter had how few.

**Same bytes twice.** The gate is fitted on the CPU whatever device the
base ran on (it is a few thousand multiply-adds per prompt), on one torch
thread, with deterministic algorithms on, and every random draw (the
initial weights, the batch order) comes from ``seed``: the same embeddings
and settings give the same weights, bit for bit. The global random state,
the thread count and the determinism flags are restored afterwards.

Where dlmstore differs from DLM: ``final_loss`` is the loss of the last step
(DLM reports a moving average), as store.db's ``gates.final_loss`` says, and
a loss that is not finite is an error instead of a warning and no gate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dlmstore.errors import TrainingError
from dlmstore.plural import plural
from dlmstore.torch_loader import require_torch

if TYPE_CHECKING:
    import torch

    from dlmstore.document.frontmatter import GateSettings

#: Prompts per optimizer step (DLM's figure; fewer when there are fewer prompts).
BATCH_SIZE = 16
#: Added inside the log of the entropy term, as DLM does, so a zero weight gives no NaN.
ENTROPY_EPS = 1e-9

GateMode = Literal["trained", "uniform"]


@dataclass(frozen=True)
class FittedGate:
    """A gate, fitted or uniform, before it is written.

    Attributes:
        mode: ``trained``, or ``uniform`` when an adapter had fewer prompts
            than the cold-start floor.
        state: the MLP's weights by name (``0.weight``, ``0.bias``,
            ``2.weight``, ``2.bias``), float32 on the CPU; None when uniform.
        input_dim: the embedding size (the base's hidden size).
        hidden_proj_dim: the MLP's hidden size.
        names: the adapters it routes between, in output order.
        steps: optimizer steps taken (0 when uniform).
        final_loss: the loss at the last step; None when uniform.
        mean_weights: its mean output over the training prompts, by
            adapter (``1/n`` each when uniform): the static mix an export uses.
        prompts: how many prompts it was given.
        note: why it is uniform, in one line; None when trained.
    """

    mode: GateMode
    state: dict[str, torch.Tensor] | None
    input_dim: int
    hidden_proj_dim: int
    names: tuple[str, ...]
    steps: int
    final_loss: float | None
    mean_weights: dict[str, float]
    prompts: int
    note: str | None


def fit_gate(
    embeddings: torch.Tensor,
    labels: Sequence[int],
    names: Sequence[str],
    settings: GateSettings,
    *,
    seed: int,
) -> FittedGate:
    """Fit the gate on ``embeddings`` (``[n, input_dim]``) labelled by adapter index, or route uniformly.

    Args:
        embeddings: one row per prompt (``dlmstore.gate.embedding.prompt_embeddings``).
        labels: each row's adapter, an index into ``names``.
        names: the declared adapters, two or more, in output order.
        settings: ``training.gate`` (its ``enabled`` is the caller's business).
        seed: the seed of the initial weights and the batch order (``training.seed``).

    Raises:
        ValueError: fewer than two names, labels that do not match the rows
            or fall outside ``names``, or embeddings that are not 2-D.
        TrainingError: the loss stopped being a finite number.
    """
    require_torch("the learned gate is fitted in torch")
    import torch

    names = tuple(names)
    labels = tuple(int(label) for label in labels)
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f"a gate routes between two or more distinct adapters, not {list(names)}")
    if embeddings.dim() != 2 or embeddings.shape[0] != len(labels):
        raise ValueError(f"embeddings of shape {tuple(embeddings.shape)} for {len(labels)} labels")
    if any(not 0 <= label < len(names) for label in labels):
        raise ValueError(f"labels must be indices into {len(names)} adapters")
    input_dim = int(embeddings.shape[1])
    uniform = {name: 1.0 / len(names) for name in names}
    note = cold_start_note(names, labels, settings.cold_start_floor)
    if note is not None:
        return FittedGate(
            "uniform", None, input_dim, settings.hidden_proj_dim, names, 0, None, uniform, len(labels), note
        )

    xs = embeddings.detach().to(device="cpu", dtype=torch.float32).contiguous()
    ys = torch.tensor(labels, dtype=torch.long)
    with _reproducible(seed):
        mlp = gate_mlp(input_dim, settings.hidden_proj_dim, len(names))
        final_loss = _train(mlp, xs, ys, settings, torch.Generator().manual_seed(seed))
        with torch.no_grad():
            mean = torch.softmax(mlp(xs), dim=-1).mean(dim=0)
    state = {key: value.detach().clone().contiguous() for key, value in sorted(mlp.state_dict().items())}
    return FittedGate(
        "trained",
        state,
        input_dim,
        settings.hidden_proj_dim,
        names,
        settings.steps,
        final_loss,
        {name: float(mean[i]) for i, name in enumerate(names)},
        len(labels),
        None,
    )


def gate_mlp(input_dim: int, hidden_proj_dim: int, outputs: int) -> torch.nn.Sequential:
    """The gate's network, without its softmax (``Linear -> GELU -> Linear``; logits out)."""
    from torch import nn

    return nn.Sequential(
        nn.Linear(input_dim, hidden_proj_dim), nn.GELU(), nn.Linear(hidden_proj_dim, outputs)
    )


def gate_loss(logits: torch.Tensor, labels: torch.Tensor, entropy_lambda: float) -> torch.Tensor:
    """DLM's gate loss: cross-entropy minus ``entropy_lambda`` times the mean entropy of the softmax."""
    import torch
    from torch.nn import functional

    probs = torch.softmax(logits, dim=-1)
    entropy = -(probs * torch.log(probs + ENTROPY_EPS)).sum(dim=-1).mean()
    return functional.cross_entropy(logits, labels) - entropy_lambda * entropy


def cold_start_note(names: Sequence[str], labels: Sequence[int], floor: int) -> str | None:
    """Why the gate must route uniformly (an adapter under the floor), in one line; None when it may train."""
    counts = [0] * len(names)
    for label in labels:
        counts[label] += 1
    short = [(name, count) for name, count in zip(names, counts, strict=True) if count < floor]
    if not short:
        return None
    found = ", ".join(f"{name!r} has {plural(count, 'tagged section')}" for name, count in short)
    return (
        f"gate: uniform routing (1/{len(names)} each): {found}, under training.gate.cold_start_floor "
        f"{floor}; route more sections to each (`::instruction#{short[0][0]}::`) or lower the floor"
    )


def _train(
    mlp: torch.nn.Sequential,
    xs: torch.Tensor,
    ys: torch.Tensor,
    settings: GateSettings,
    generator: torch.Generator,
) -> float:
    """``settings.steps`` AdamW steps over seeded permutations of the prompts; the last step's loss."""
    import torch

    optimizer = torch.optim.AdamW(mlp.parameters(), lr=settings.lr)
    n = int(xs.shape[0])
    batch = min(BATCH_SIZE, n)
    order = torch.randperm(n, generator=generator)
    cursor = 0
    loss_value = float("nan")
    for step in range(settings.steps):
        if cursor + batch > n:
            order = torch.randperm(n, generator=generator)
            cursor = 0
        index = order[cursor : cursor + batch]
        cursor += batch
        loss = gate_loss(mlp(xs[index]), ys[index], settings.entropy_lambda)
        loss_value = float(loss.item())
        if not torch.isfinite(loss):
            raise TrainingError(
                f"the learned gate's loss became {loss_value} at step {step + 1} of {settings.steps}",
                hint="lower training.gate.lr, or set training.gate.enabled: false to train without a gate",
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return loss_value


@contextmanager
def _reproducible(seed: int) -> Iterator[None]:
    """Seeded global CPU RNG (for the initial weights), one thread, deterministic algorithms; then as it was."""
    import torch

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
            torch.set_num_threads(threads)
