"""DP inputs are checked before anything is computed (issue 29): a NaN noise multiplier used to
hang Opacus, -1 failed only at the end of a run, δ = 1 gave a negative ε, and a NaN client update
turned a whole DP cluster's model into NaN without an error."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from fedrec.federation.privacy import (
    GaussianMechanism,
    dp_aggregate,
    epsilon,
    epsilon_of,
    fel_epsilon,
    noise_multiplier_for,
    validate_dp_arguments,
)
from fedrec.federation.secagg import MalformedContribution, SecAggAborted

BAD_NOISE = [math.nan, math.inf, -math.inf, -1.0, -1e-9, "1.0", None, True]
BAD_DELTA = [0.0, 1.0, 1.5, -1e-5, math.nan, math.inf, "1e-5", False]
BAD_RATE = [0.0, -0.1, 1.0001, math.nan, math.inf, "0.1", True]
BAD_STEPS = [-1, 2.5, 3.0, math.nan, "10", True, None]


def test_nan_noise_multiplier_is_refused_and_does_not_hang():
    """Before, epsilon(nan, ...) never returned: a child process with a time limit shows it."""
    code = (
        "from fedrec.federation.privacy import epsilon\n"
        "try:\n"
        "    epsilon(float('nan'), 0.1, 10, 1e-5)\n"
        "except ValueError as error:\n"
        "    print('refused:', error)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    ).stdout
    assert "refused: noise_multiplier must be finite, got nan" in out


@pytest.mark.parametrize("z", BAD_NOISE)
def test_bad_noise_multipliers_are_refused(z):
    with pytest.raises(ValueError, match="noise_multiplier must be"):
        epsilon(z, 0.1, 10, 1e-5)
    with pytest.raises(ValueError, match="noise_multiplier must be"):
        GaussianMechanism(z, 0.1, 10)
    if z is not None:  # None: not given (a config with target_epsilon instead)
        with pytest.raises(ValueError, match="noise_multiplier must be"):
            validate_dp_arguments(noise_multiplier=z)


@pytest.mark.parametrize("delta", BAD_DELTA)
def test_bad_deltas_are_refused(delta):
    mechanism = GaussianMechanism(1.0, 0.1, 10)
    with pytest.raises(ValueError, match=r"delta must be"):
        epsilon(1.0, 0.1, 10, delta)
    with pytest.raises(ValueError, match=r"delta must be"):
        epsilon_of([mechanism], delta)
    with pytest.raises(ValueError, match=r"delta must be"):
        fel_epsilon({0: [mechanism]}, delta)
    with pytest.raises(ValueError, match=r"delta must be"):
        noise_multiplier_for(1.0, delta, 0.1, 10)
    with pytest.raises(ValueError, match=r"delta must be"):
        validate_dp_arguments(delta=delta)


def test_delta_one_no_longer_gives_a_negative_epsilon():
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\), got 1"):
        epsilon(1.0, 0.1, 100, 1.0)


@pytest.mark.parametrize("q", BAD_RATE)
def test_bad_sample_rates_are_refused(q):
    with pytest.raises(ValueError, match="sample_rate must be"):
        epsilon(1.0, q, 10, 1e-5)
    with pytest.raises(ValueError, match="sample_rate must be"):
        noise_multiplier_for(1.0, 1e-5, q, 10)
    with pytest.raises(ValueError, match="sample_rate must be"):
        validate_dp_arguments(sample_rate=q)


@pytest.mark.parametrize("steps", BAD_STEPS)
def test_bad_steps_are_refused(steps):
    with pytest.raises(ValueError, match="steps must be"):
        epsilon(1.0, 0.1, steps, 1e-5)
    with pytest.raises(ValueError, match="steps must be"):
        noise_multiplier_for(1.0, 1e-5, 0.1, steps)


def test_calibration_needs_a_round_and_a_positive_target():
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        noise_multiplier_for(1.0, 1e-5, 0.1, 0)
    for target in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="target_epsilon must be"):
            noise_multiplier_for(target, 1e-5, 0.1, 10)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"clip_norm": 0.0}, "clip_norm must be > 0"),
        ({"clip_norm": math.nan}, "clip_norm must be finite"),
        ({"target_epsilon": -1.0}, "target_epsilon must be > 0"),
        ({"target_epsilon": math.inf}, "target_epsilon must be finite"),
        ({"noise_multiplier": -1.0}, "noise_multiplier must be >= 0, got -1.0"),
        ({"rounds": 0}, "rounds must be >= 1"),
        ({"rounds": 2.0}, "rounds must be an integer"),
        ({"sample_rate": 0.0}, r"sample_rate must be in \(0, 1\]"),
    ],
)
def test_validate_dp_arguments_names_the_bad_argument(arguments, message):
    with pytest.raises(ValueError, match=message):
        validate_dp_arguments(**arguments)


@pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")
def test_valid_arguments_pass_and_give_the_same_epsilon():
    validate_dp_arguments(
        clip_norm=0.5, noise_multiplier=0, target_epsilon=2, delta=1e-5, sample_rate=1, rounds=1
    )
    validate_dp_arguments()  # nothing given, nothing to check
    assert epsilon(1.0, 0.1, 0, 1e-5) == 0.0
    assert epsilon(0.0, 0.1, 5, 1e-5) == math.inf  # no noise: no guarantee, but an answer
    # NumPy numbers are numbers; they share the cache with the Python ones
    mech = GaussianMechanism(np.float64(1.1), np.float32(0.25), np.int64(20))
    assert type(mech.steps) is int and type(mech.noise_multiplier) is float
    assert epsilon_of([mech], 1e-5) == epsilon(1.1, 0.25, 20, 1e-5) > 0


def _round(deltas: torch.Tensor, cluster: list[int], **kwargs) -> torch.Tensor:
    settings = {
        "clip_norm": 1.0,
        "noise_multiplier": 1.0,
        "denominator": torch.tensor([1.0, 2.0]),
        "generator": torch.Generator().manual_seed(0),
    }
    settings.update(kwargs)
    return dp_aggregate(deltas, torch.tensor(cluster, dtype=torch.int64), 2, **settings)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_client_update_aborts_the_round(bad):
    deltas = torch.ones(3, 4)
    deltas[2, 1] = bad
    with pytest.raises(MalformedContribution, match=r"rows \[2\], cluster\(s\) \[1\]"):
        _round(deltas, [0, 1, 1])
    with pytest.raises(SecAggAborted, match=r"malformed client update.*round aborted"):
        _round(deltas, [0, 1, 1])  # the abort MF-SecAvg raises, caught the same way


def test_a_nan_update_no_longer_poisons_its_cluster_silently():
    """What happened before: the whole of cluster 1's average became NaN."""
    deltas = torch.ones(3, 4)
    deltas[1, 0] = math.nan
    generator = torch.Generator().manual_seed(0)
    try:
        out = _round(deltas, [0, 1, 1], generator=generator)
    except MalformedContribution:
        return
    pytest.fail(f"no error; cluster 1 became {out[1].tolist()}")  # pragma: no cover


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": math.nan}, "noise_multiplier must be finite"),
        ({"noise_multiplier": -1.0}, "noise_multiplier must be >= 0"),
        ({"clip_norm": 0.0}, "clip_norm must be > 0"),
        ({"clip_norm": math.inf}, "clip_norm must be finite"),
        ({"denominator": torch.tensor([1.0, 0.0])}, r"denominator \(q N_c\) must be finite"),
        ({"denominator": torch.tensor([1.0, math.nan])}, r"denominator \(q N_c\) must be finite"),
        ({"denominator": torch.tensor([1.0])}, r"denominator must have shape \(2,\)"),
    ],
)
def test_bad_aggregation_settings_are_refused_before_any_noise_is_drawn(kwargs, message):
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    with pytest.raises(ValueError, match=message):
        _round(torch.ones(2, 3), [0, 1], generator=generator, **kwargs)
    assert torch.equal(generator.get_state(), state)


def test_dp_aggregate_is_unchanged_on_valid_input():
    deltas = torch.tensor([[3.0, 4.0], [0.3, 0.4], [1.0, 0.0]])
    out = _round(deltas, [0, 0, 1], noise_multiplier=0.0)
    expected = torch.tensor([[0.6 + 0.3, 0.8 + 0.4], [1.0 / 2.0, 0.0]])
    torch.testing.assert_close(out, expected)
    empty = _round(torch.zeros(0, 2), [], noise_multiplier=0.0)  # a round without clients
    assert torch.equal(empty, torch.zeros(2, 2))


@pytest.mark.parametrize("z", [-1.0, math.nan])
def test_a_bad_noise_multiplier_stops_fel_before_training(tmp_path, z):
    """Before, -1 trained every round and failed in the accounting at the end (NaN hung there).
    Now the DPConfig refuses it when built, and a config that slipped past that (built without
    __post_init__) is refused by the first DP aggregation."""
    from fedrec.envs.datasets.click_data import click_data_from_taobao
    from fedrec.envs.datasets.taobao_synthetic import write_taobao_groups
    from fedrec.train.fel import DPConfig, FedConfig, train_federated

    with pytest.raises(ValueError, match="noise_multiplier must be"):
        DPConfig(noise_multiplier=z)
    data = click_data_from_taobao(
        write_taobao_groups(tmp_path, num_users=120, num_ads=40, ctr=0.1, seed=0)
    )
    unchecked = object.__new__(DPConfig)
    for name, value in {"clip_norm": 1.0, "noise_multiplier": z, "target_epsilon": None}.items():
        object.__setattr__(unchecked, name, value)
    object.__setattr__(unchecked, "delta", 1e-5)
    rounds: list[int] = []
    config = FedConfig(rounds=6, sample_rate=0.5, dp=unchecked)
    with pytest.raises(ValueError, match="noise_multiplier must be"):
        train_federated(data, np.zeros(data.num_clients, np.int64), config, progress=rounds.append)
    assert len(rounds) == 1
