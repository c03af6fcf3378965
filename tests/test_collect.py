"""fedrec.train.collect and `fedrec data collect`: exact logging propensities, a Minari dataset
that minari reads back with its metadata, and bad policies and envs refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedrec.cli import main
from fedrec.train.collect import collect, default_dataset_id, save_minari

ENV = "fedrec/ChocKaleSlate-v0"  # 10 candidates, slates of 3
N, K = 10, 3


def test_mixture_propensities_are_exact() -> None:
    data = collect(ENV, "top_x", episodes=3, seed=1, epsilon=0.3, num_envs=2, progress=False)
    assert len(data.episodes) == 3
    uniform = 1 / math.perm(N, K)
    for episode in data.episodes:
        slates, slate_p = episode["actions"], episode["propensity_slate"]
        assert slates.shape[1] == K and len(slate_p) == len(episode["rewards"])
        greedy = np.isclose(slate_p, 0.7 + 0.3 * uniform)
        # Every slate is either the deterministic policy's (with the mixture's mass) or not.
        assert np.all(greedy | np.isclose(slate_p, 0.3 * uniform))
        slot = episode["propensity_slot"]
        assert np.all(np.isclose(slot, 0.7 + 0.03) | np.isclose(slot, 0.03))
        prefix = episode["propensity_prefix"]
        assert np.allclose(prefix[:, -1], slate_p)
        assert np.all(np.diff(prefix, axis=1) <= 0)
        assert np.allclose(prefix[~greedy, 0], np.where(slot[~greedy, 0] > 0.5, 0.73, 0.03))
        assert np.all(episode["clicks"].sum(axis=1) <= 1)
        assert np.allclose(episode["slot_rewards"].sum(axis=1)[episode["clicks"].any(1)],
                           episode["rewards"][episode["clicks"].any(1)])  # fmt: skip
    both = np.concatenate([e["propensity_slate"] for e in data.episodes])
    # About 70% + 30%/720 of the slates are the greedy one.
    assert 0.55 < np.mean(both > 0.5) < 0.85


def test_uniform_logger_and_deterministic_policy() -> None:
    data = collect(ENV, "random", episodes=2, seed=0, progress=False)
    p = np.concatenate([e["propensity_slate"] for e in data.episodes])
    assert np.allclose(p, 1 / 720)
    prefix = data.episodes[0]["propensity_prefix"]
    assert np.allclose(prefix, [1 / 10, 1 / 90, 1 / 720])
    greedy = collect(ENV, "bottom_x", episodes=2, seed=0, progress=False)
    assert np.all(greedy.episodes[0]["propensity_slate"] == 1.0)


def test_collect_is_reproducible() -> None:
    a = collect(ENV, "top_x", episodes=2, seed=3, epsilon=0.5, progress=False)
    b = collect(ENV, "top_x", episodes=2, seed=3, epsilon=0.5, progress=False)
    assert np.array_equal(a.episodes[1]["actions"], b.episodes[1]["actions"])


def test_minari_reads_the_dataset_back(tmp_path, monkeypatch) -> None:
    minari = pytest.importorskip("minari")
    data = collect(ENV, "top_x", episodes=3, seed=2, epsilon=0.2, num_envs=2, progress=False)
    path = save_minari(data, tmp_path)
    dataset_id = default_dataset_id(ENV, "top_x", 0.2, "random")
    assert dataset_id == "fedrec/ChocKaleSlate/top_x-eps0p2-random-v0"
    assert path == tmp_path / dataset_id / "data"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    dataset = minari.load_dataset(dataset_id)
    assert dataset.total_episodes == 3
    assert dataset.total_steps == sum(len(e["rewards"]) for e in data.episodes)
    meta = dataset.storage.metadata["fedrec"]
    assert meta["env_id"] == ENV and meta["policy"] == "top_x" and meta["seed"] == 2
    assert meta["epsilon"] == 0.2 and meta["mixture_with"] == "random"
    assert meta["env_kwargs"] == {}
    assert dataset.spec.env_spec.id == ENV
    for logged, episode in zip(data.episodes, dataset.iterate_episodes(), strict=True):
        steps = len(logged["rewards"])
        assert np.array_equal(episode.actions, logged["actions"])
        assert np.allclose(episode.rewards, logged["rewards"])
        assert episode.observations["user"].shape == (steps + 1, 1)
        propensity = episode.infos["propensity_slate"]
        assert len(propensity) == steps + 1 and math.isnan(propensity[-1])
        assert np.allclose(propensity[:-1], logged["propensity_slate"])
        assert np.allclose(episode.infos["propensity_slot"][:-1], logged["propensity_slot"])
    with pytest.raises(FileExistsError):
        save_minari(data, tmp_path)
    with pytest.raises(ValueError, match="dataset id"):
        save_minari(data, tmp_path, "bad id!")


def test_env_kwargs_are_recorded(tmp_path) -> None:
    pytest.importorskip("minari")
    from minari import MinariDataset

    data = collect(ENV, "top_x", episodes=1, seed=0, env_kwargs={"time_budget": 5}, progress=False)
    path = save_minari(data, tmp_path, "fedrec/short-v0")
    dataset = MinariDataset(path)
    assert dataset.storage.metadata["fedrec"]["env_kwargs"] == {"time_budget": 5}
    assert dataset.spec.env_spec.kwargs["time_budget"] == 5


@pytest.mark.parametrize(
    ("env", "policy", "kwargs", "message"),
    [
        ("fedrec/NoSuchEnv-v0", "top_x", {}, "not a registered single-platform"),
        ("fedrec/ChocKaleMultiPlatform-v0", "top_x", {}, "not a registered single-platform"),
        (ENV, "no_such_agent", {}, "unknown agent"),
        (ENV, "top_x", {"epsilon": 1.5}, "epsilon"),
        (ENV, "top_x", {"episodes": 0}, "episodes"),
    ],
)
def test_bad_inputs_refused(env, policy, kwargs, message) -> None:
    args = {"episodes": 1, "seed": 0, "progress": False} | kwargs
    with pytest.raises(ValueError, match=message):
        collect(env, policy, **args)


def test_stochastic_policy_refused(tmp_path) -> None:
    agent = tmp_path / "noisy.py"
    agent.write_text(
        "import numpy as np\n"
        "from fedrec.agents.base import SlateAgent\n"
        "class Noisy(SlateAgent):\n"
        "    def act_batch(self, observations, *, infos=None):\n"
        "        n = observations['candidates'].shape[1]\n"
        "        keys = self.rng.random((observations['candidates'].shape[0], n))\n"
        "        return np.argsort(keys, axis=1)[:, : self.slate_size]\n"
    )
    with pytest.raises(ValueError, match="stochastic"):
        collect(ENV, f"{agent}:Noisy", episodes=1, seed=0, progress=False)
    with pytest.raises(ValueError, match="stochastic"):
        collect(ENV, "top_x", episodes=1, seed=0, epsilon=0.1, mixture_with=f"{agent}:Noisy",
                progress=False)  # fmt: skip


def test_cli_collect(tmp_path, capsys) -> None:
    pytest.importorskip("minari")
    out = tmp_path / "datasets"
    args = ["data", "collect", "--env", ENV, "--policy", "top_x", "--epsilon", "0.1"]
    code = main([*args, "--episodes", "2", "--seed", "0", "--out", str(out), "--no-progress"])
    assert code == 0
    assert "minari.load_dataset('fedrec/ChocKaleSlate/top_x-eps0p1-random-v0')" in (
        capsys.readouterr().out
    )
    assert (out / "fedrec/ChocKaleSlate/top_x-eps0p1-random-v0/data/metadata.json").is_file()
    code = main(["data", "collect", "--env", ENV, "--policy", "nope", "--episodes", "1",
                 "--out", str(out), "--no-progress"])  # fmt: skip
    assert code == 2
    assert "unknown agent" in capsys.readouterr().err
