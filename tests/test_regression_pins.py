"""Short fixed-seed runs of the built-in SlateQ, FedSlate family and FedNCF, pinned to the numbers
they gave before the training loops were rebuilt on one core: a refactor must not change them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedrec.agents.ncf import NCFConfig
from fedrec.agents.slateq import SlateQAgent, SlateQConfig
from fedrec.envs.datasets.synthetic import synthetic_log, write_ml100k
from fedrec.train.fedncf import FedNCFConfig, train_federated
from fedrec.train.loop import TrainConfig, train
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

SMALL = {"num_candidates": 10, "slate_size": 3}
SMALL_NETS = {
    "learning_starts": 300,
    "batch_size": 16,
    "local_hidden": (32,),
    "global_hidden": (32,),
}

#: method -> (sum of training returns per platform, final greedy evaluation per platform)
MULTI_PLATFORM_PINS = {
    "fedslate": ((15408.325078608512, 15780.155223194586), (964.0033846942522, 801.9707038931479)),
    "slateq": ((15417.293269944985, 15758.474724305654), (940.8778341573982, 810.4051583350249)),
    "fedq": ((15421.34687451817, 15778.147186223176), (935.9160485076004, 805.1101010554705)),
    "random": ((15526.502583809208, 15500.972814749184), (932.1614203178392, 814.849506395298)),
}
#: model -> (HR@10, NDCG@10) after each of 2 global rounds
FEDNCF_PINS = {
    "gmf": [(0.05172413793103448, 0.029350304896901217)] * 2,
    "neumf": [
        (0.10344827586206896, 0.037846890710553846),
        (0.06896551724137931, 0.02624232019340186),
    ],
}


def test_slateq_numbers_are_unchanged() -> None:
    config = SlateQConfig(learning_starts=200, batch_size=16, epsilon_decay=500)
    result = train(
        lambda env: SlateQAgent.from_env(env, config=config, seed=3),
        config=TrainConfig(
            env_id="fedrec/ChocKaleSlate-v0",
            episodes=32,
            num_envs=8,
            seed=3,
            env_kwargs=SMALL,
            eval_episodes=16,
            references=False,
            progress=False,
        ),
    )
    assert float(np.sum(result.returns)) == pytest.approx(33372.87636767202, rel=1e-9)
    assert result.final_eval["policies"]["agent"]["mean"] == pytest.approx(
        1062.720645460689, rel=1e-9
    )


@pytest.mark.parametrize("method", list(MULTI_PLATFORM_PINS))
def test_multi_platform_numbers_are_unchanged(method: str) -> None:
    result = train_multi_platform(
        MultiPlatformTrainConfig(
            method=method,
            episodes=16,
            num_users=8,
            seed=5,
            env_kwargs=SMALL,
            agent_kwargs={} if method == "random" else SMALL_NETS,
            eval_episodes=8,
            planner=False,
            progress=False,
        )
    )
    returns, evaluation = MULTI_PLATFORM_PINS[method]
    for i, platform in enumerate(("platform_a", "platform_b")):
        assert float(result.returns[platform].sum()) == pytest.approx(returns[i], rel=1e-9)
        greedy = result.final_eval["policies"]["agent"][platform]["mean"]
        assert greedy == pytest.approx(evaluation[i], rel=1e-9)


@pytest.fixture(scope="module")
def ml100k_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pins")
    write_ml100k(root / "ml-100k", synthetic_log(num_users=60, num_items=300, seed=0))
    return root


@pytest.mark.parametrize("model", list(FEDNCF_PINS))
def test_fedncf_numbers_are_unchanged(model: str, ml100k_dir: Path) -> None:
    result = train_federated(
        dataset="ml-100k",
        data_dir=ml100k_dir,
        progress=False,
        config=FedNCFConfig(
            model=NCFConfig(model=model),
            global_rounds=2,
            clients_per_round=20,
            eval_every=1,
            seed=2,
            client_optimizer="fresh",  # the pins predate the federated default
            simulation="batched",  # and the compiled default (where Numba installs)
        ),
    )
    measured = [value for p in result.history for value in (p.hit_rate, p.ndcg)]
    expected = [value for point in FEDNCF_PINS[model] for value in point]
    assert measured == pytest.approx(expected, rel=1e-9)
