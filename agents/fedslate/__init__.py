"""FedSlate (Deng et al., 2024): federated slate Q-learning across platforms, and its baselines.

K platforms recommend to the same user. Platform k keeps a *local* Q network Q_k(s_k) in R^N (one
value per candidate), its replay, rewards and choice model; a federated server keeps the *global*
network F, which maps [Q_k(s_k); Q_others(s_others)] (own first, the others in platform order) to
platform k's federated item values Q~_k. A platform serves the SlateQ greedy slate on
(v, Q~_k), with v its choice model's weights. Every tensor that crosses a party boundary goes
through :class:`fedrec.federation.channel.Channel` (validated and counted); the parties are
separate objects (:class:`Platform`, :class:`FederatedServer`) that hold no reference to each
other, so no party can read another's data, rewards or parameters. The protocol (who sends what,
when) is in :class:`FedSlateAgent` and ``docs/fedslate.md``. With ``parties="processes"`` the
server and each platform run in their own OS process and the messages travel over gRPC on
loopback, with the same results and traffic (``agents/fedslate/remote.py``).

Methods (``FedSlateConfig.method``):

* ``fedslate`` -- the basic version (docs/fedslate.md, "Methods"): each platform with feedback does the "A" update
  (SmoothL1 of Q~_A(s, i_c) on y_A = r + gamma (1 - done) W(s', greedy on F^-[Q^-(s')])); each
  platform without feedback does the "B" update: SmoothL1 of its greedy slate value W(s_B, Q~_B)
  on the feedback platform's label y_A for the same step (it never sees a reward of its own).
* ``fedslate_exp`` -- FedSlate(exp) (docs/fedslate.md, "Methods"): every platform has feedback and does the A update
  with its own reward, click and next state.
* ``fedq`` -- our FedQ baseline (no public code): the same federated networks and protocol, but
  a DQN without the slate decomposition: the consumed item is the action, the target is
  r + gamma max_j Q~^-(s', j), slates are the top-k of Q~ and a no-feedback platform regresses
  max_j Q~_B(s_B, j) on the label.
* ``slateq`` -- per-platform SlateQ with the same local network and schedule, without F: nothing
  crosses a boundary, and a platform without feedback cannot learn (it keeps its initial net).

``global_network="linear"`` is the paper's ablation (F is one linear layer).
``global_network="residual"`` (Q~_k = Q_k + MLP([Q_k; Q_others]), the MLP's last layer starting at
zero) and ``local_network="itemwise"`` are labelled deviations from the paper, measured in
``docs/fedslate.md`` ("Diagnosis"); the paper's architecture stays the default.

Quirks of the official code that are fixed (docs/fedslate.md, "Official-code quirks fixed"): predictions use online nets on s and
targets use target nets on s' (all platforms); labels are NumPy arrays received by message, so no
gradient flows through them; no raw document ids (state = [user, candidate features, last H
engagement vectors]); linear output heads with rewards scaled by 1 / mean |reward| of the burn-in
(the code's tanh heads saturate with per-step rewards of 10-20); the agent's choice model defaults
to the env's true MNL (``choice_model="paper"`` is the code's misspecified softmax).

What it may import: ``fedrec.envs``, ``fedrec.federation`` (the channel, the transport, the
process supervisor) and ``fedrec.agents``; nothing above the agents layer (tests/test_layers.py).
"""

from fedrec.agents.fedslate.config import (
    FEDERATED_METHODS,
    METHODS,
    FedSlateConfig,
    Method,
    Observations,
)
from fedrec.agents.fedslate.method import FedSlateAgent
from fedrec.agents.fedslate.networks import (
    ACTIVATIONS,
    LOCAL_NETWORKS,
    FederatedNetwork,
    ItemwiseLocalQNetwork,
    LocalQNetwork,
)
from fedrec.agents.fedslate.platform import Platform, platform_state, smooth_l1_and_grad
from fedrec.agents.fedslate.server import FederatedServer
from fedrec.agents.multi_platform import RandomMultiPolicy
from fedrec.agents.replay import PlatformReplay

__all__ = [
    "ACTIVATIONS",
    "FEDERATED_METHODS",
    "LOCAL_NETWORKS",
    "METHODS",
    "FedSlateAgent",
    "FedSlateConfig",
    "FederatedNetwork",
    "FederatedServer",
    "ItemwiseLocalQNetwork",
    "LocalQNetwork",
    "Method",
    "Observations",
    "Platform",
    "PlatformReplay",
    "RandomMultiPolicy",
    "platform_state",
    "smooth_l1_and_grad",
]
