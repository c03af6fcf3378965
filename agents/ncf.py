"""GMF, MLP and NeuMF (He et al., NCF, WWW 2017) with FedNCF's settings as defaults.

Layer reading (FedNCF gives "latent dimension 12, hidden layers 48/24/12/6"; we take *reading A*
of ``docs/fedncf.md``): every embedding is ``latent_dim`` = 12 wide; the MLP tower maps the
concatenation ``[p_u ; q_i]`` (24) through Linear layers of widths 48 -> 24 -> 12 -> 6 with ReLU,
so the predictive factor of MLP is 6; NeuMF has separate GMF and MLP embeddings and its output
layer sees ``[p^G ⊙ q^G ; z_L]`` (12 + 6 = 18 inputs). With 943 users and 1,682 items the MLP's
network (tower + output layer) has 2,761 weights and GMF's output layer 13.

Everything is initialised with Xavier-uniform (FedNCF; NCF used N(0, 0.01)) and biases with zeros;
the model returns logits (the BCE loss is ``binary_cross_entropy_with_logits``).

The module is also the *layout* shared by the federated code: :func:`network_names` fixes the
order in which the global network weights are flattened into one vector, and the item tables of
GMF and MLP are handled as one table of width ``item_width`` (GMF columns first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

ModelName = Literal["gmf", "mlp", "neumf"]
MODELS: tuple[str, ...] = ("gmf", "mlp", "neumf")


@dataclass(frozen=True)
class NCFConfig:
    """Architecture of one NCF model (defaults: FedNCF's settings, layer reading A)."""

    model: ModelName = "gmf"
    """which NCF model: "gmf", "mlp" or "neumf"."""
    latent_dim: int = 12
    """width of every user/item embedding (GMF and MLP alike)."""
    hidden: tuple[int, ...] = (48, 24, 12, 6)
    """widths of the MLP tower's Linear+ReLU layers (input: the 2*latent_dim concatenation)."""

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.latent_dim < 1:
            raise ValueError(f"latent_dim must be >= 1, got {self.latent_dim}")
        if self.model != "gmf" and (not self.hidden or min(self.hidden) < 1):
            raise ValueError(f"hidden must be non-empty positive widths, got {self.hidden}")

    @property
    def uses_gmf(self) -> bool:
        return self.model in ("gmf", "neumf")

    @property
    def uses_mlp(self) -> bool:
        return self.model in ("mlp", "neumf")

    @property
    def gmf_dim(self) -> int:
        """Width of the GMF embeddings (0 for MLP)."""
        return self.latent_dim if self.uses_gmf else 0

    @property
    def mlp_dim(self) -> int:
        """Width of the MLP embeddings (0 for GMF)."""
        return self.latent_dim if self.uses_mlp else 0

    @property
    def item_width(self) -> int:
        """Columns of the combined item table ``[q^G | q^M]`` (also the user row's width)."""
        return self.gmf_dim + self.mlp_dim

    @property
    def head_inputs(self) -> int:
        """Inputs of the output layer: GMF product and/or the last MLP layer."""
        return self.gmf_dim + (self.hidden[-1] if self.uses_mlp else 0)

    def layer_shapes(self) -> list[tuple[int, int]]:
        """(out, in) of every MLP tower layer (empty for GMF)."""
        if not self.uses_mlp:
            return []
        widths = (2 * self.latent_dim, *self.hidden)
        return list(zip(widths[1:], widths[:-1], strict=True))

    def network_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Name and shape of every global network weight, in flattening order."""
        shapes: list[tuple[str, tuple[int, ...]]] = []
        for index, (out, inp) in enumerate(self.layer_shapes()):
            shapes.append((f"mlp.{index}.weight", (out, inp)))
            shapes.append((f"mlp.{index}.bias", (out,)))
        shapes.append(("head.weight", (1, self.head_inputs)))
        shapes.append(("head.bias", (1,)))
        return shapes

    @property
    def network_size(self) -> int:
        """Number of global network weights (MLP tower and output layer)."""
        return sum(int(torch.Size(shape).numel()) for _, shape in self.network_shapes())

    def forward_flops(self) -> int:
        """Multiply-adds x 2 of one forward pass for one (user, item) pair (embedding look-ups free)."""
        flops = 2 * self.head_inputs + 1
        if self.uses_gmf:
            flops += self.gmf_dim
        for out, inp in self.layer_shapes():
            flops += 2 * out * inp + 2 * out  # affine + ReLU
        return flops


def network_names(config: NCFConfig) -> list[str]:
    """Parameter names of the global network weights, in flattening order."""
    return [name for name, _ in config.network_shapes()]


class NCF(nn.Module):
    """GMF, MLP or NeuMF over ``num_users`` x ``num_items``; ``forward`` returns logits.

    Embedding tables are sparse (``nn.Embedding(sparse=True)``) so that Adam on them is lazy
    (``torch.optim.SparseAdam``): only rows in the batch move, as in the federated clients.
    """

    def __init__(
        self,
        config: NCFConfig,
        *,
        num_users: int,
        num_items: int,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if num_users < 1 or num_items < 1:
            raise ValueError(f"need >= 1 user and item, got {num_users} and {num_items}")
        self.config = config
        self.num_users = num_users
        self.num_items = num_items
        d = config.latent_dim
        self.user_gmf = nn.Embedding(num_users, d, sparse=True) if config.uses_gmf else None
        self.item_gmf = nn.Embedding(num_items, d, sparse=True) if config.uses_gmf else None
        self.user_mlp = nn.Embedding(num_users, d, sparse=True) if config.uses_mlp else None
        self.item_mlp = nn.Embedding(num_items, d, sparse=True) if config.uses_mlp else None
        self.mlp = nn.ModuleList(nn.Linear(inp, out) for out, inp in config.layer_shapes())
        self.head = nn.Linear(config.head_inputs, 1)
        self.reset_parameters(generator=generator)

    def reset_parameters(self, *, generator: torch.Generator | None = None) -> None:
        """Xavier-uniform weights and embeddings, zero biases (in a fixed order, for seeding)."""
        with torch.no_grad():
            for table in self.embedding_tables():
                nn.init.xavier_uniform_(table.weight, generator=generator)
            for layer in [*self.mlp, self.head]:
                nn.init.xavier_uniform_(layer.weight, generator=generator)
                nn.init.zeros_(layer.bias)

    def embedding_tables(self) -> list[nn.Embedding]:
        """The embedding tables that exist, in the order user GMF, item GMF, user MLP, item MLP."""
        tables = (self.user_gmf, self.item_gmf, self.user_mlp, self.item_mlp)
        return [table for table in tables if table is not None]

    def network_parameters(self) -> list[nn.Parameter]:
        """The global network weights, in the order of :func:`network_names`."""
        named = dict(self.named_parameters())
        return [named[name] for name in network_names(self.config)]

    def features(self, user_rows: torch.Tensor, item_rows: torch.Tensor) -> torch.Tensor:
        """Output-layer inputs from combined user rows ``[p^G|p^M]`` and item rows ``[q^G|q^M]``."""
        g = self.config.gmf_dim
        parts = []
        if self.config.uses_gmf:
            parts.append(user_rows[..., :g] * item_rows[..., :g])
        if self.config.uses_mlp:
            z = torch.cat([user_rows[..., g:], item_rows[..., g:]], dim=-1)
            for layer in self.mlp:
                z = torch.relu(layer(z))
            parts.append(z)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def user_rows(self, users: torch.Tensor) -> torch.Tensor:
        """Combined user rows ``[p^G | p^M]`` of ``users``."""
        parts = [t(users) for t in (self.user_gmf, self.user_mlp) if t is not None]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def item_rows(self, items: torch.Tensor) -> torch.Tensor:
        """Combined item rows ``[q^G | q^M]`` of ``items``."""
        parts = [t(items) for t in (self.item_gmf, self.item_mlp) if t is not None]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Logits of (user, item) pairs (any matching shapes)."""
        feats = self.features(self.user_rows(users), self.item_rows(items))
        return self.head(feats).squeeze(-1)

    @torch.no_grad()
    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Predicted interaction probabilities σ(logit)."""
        return torch.sigmoid(self(users, items))

    # -- the federated layout -----------------------------------------------------------------

    @torch.no_grad()
    def item_table(self) -> torch.Tensor:
        """The combined item table ``[q^G | q^M]``, (num_items, item_width), a copy."""
        return self.item_rows(torch.arange(self.num_items)).clone()

    @torch.no_grad()
    def user_table(self) -> torch.Tensor:
        """The combined user table ``[p^G | p^M]``, (num_users, item_width), a copy."""
        return self.user_rows(torch.arange(self.num_users)).clone()

    @torch.no_grad()
    def network_vector(self) -> torch.Tensor:
        """The global network weights flattened in :func:`network_names` order."""
        return torch.cat([p.reshape(-1) for p in self.network_parameters()]).clone()

    @torch.no_grad()
    def load_federated(
        self,
        *,
        user_table: torch.Tensor | None = None,
        item_table: torch.Tensor | None = None,
        network: torch.Tensor | None = None,
    ) -> NCF:
        """Overwrite (any of) the combined user table, item table and flat network weights."""
        g = self.config.gmf_dim
        for table, gmf, mlp in (
            (user_table, self.user_gmf, self.user_mlp),
            (item_table, self.item_gmf, self.item_mlp),
        ):
            if table is None:
                continue
            if table.shape[1] != self.config.item_width:
                raise ValueError(f"table width {table.shape[1]} != {self.config.item_width}")
            if gmf is not None:
                gmf.weight.copy_(table[:, :g])
            if mlp is not None:
                mlp.weight.copy_(table[:, g:])
        if network is not None:
            if network.numel() != self.config.network_size:
                raise ValueError(
                    f"network has {network.numel()} weights, expected {self.config.network_size}"
                )
            offset = 0
            for param in self.network_parameters():
                param.copy_(network[offset : offset + param.numel()].view_as(param))
                offset += param.numel()
        return self


def make_optimizers(model: NCF, *, lr: float) -> list[torch.optim.Optimizer]:
    """SparseAdam on the (sparse) embedding tables and Adam on the network (both at ``lr``)."""
    tables = [t.weight for t in model.embedding_tables()]
    return [
        torch.optim.SparseAdam(tables, lr=lr),
        torch.optim.Adam(model.network_parameters(), lr=lr),
    ]
