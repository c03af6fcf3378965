"""Every environment class carries a Gymnasium-style card as its docstring (``help(env)``)."""

from __future__ import annotations

import re

import pytest

from fedrec.envs.cascade import ChocKaleCascadeEnv
from fedrec.envs.choc_kale import ChocKaleEnv
from fedrec.envs.datasets.environments import LoggedEvaluationEnv, LoggedInteractionEnv
from fedrec.envs.datasets.taobao import TaobaoAdsEnv
from fedrec.envs.interest_evolution import InterestEvolutionEnv
from fedrec.envs.multi_platform import ChocKaleMultiPlatformEnv

SECTIONS = (
    "Description",
    "Action Space",
    "Observation Space",
    "Rewards",
    "Episode End",
    "Arguments",
)


@pytest.mark.parametrize(
    "env_class",
    [
        ChocKaleEnv,
        ChocKaleCascadeEnv,
        ChocKaleMultiPlatformEnv,
        InterestEvolutionEnv,
        LoggedEvaluationEnv,
        LoggedInteractionEnv,
        TaobaoAdsEnv,
    ],
)
def test_environment_card_has_the_gymnasium_sections(env_class: type) -> None:
    doc = env_class.__doc__ or ""
    found = re.findall(r"^\s*## (.+?)\s*$", doc, flags=re.MULTILINE)
    missing = [section for section in SECTIONS if section not in found]
    assert not missing, f"{env_class.__name__}: card lacks {missing}"


def test_logged_evaluation_card_states_the_spaces_of_its_arguments() -> None:
    doc = LoggedEvaluationEnv.__doc__
    assert "SlateSpace(C, K)" in doc and "num_test_negatives + 1" in doc
    for argument in ("top_k=10", "num_test_negatives=100", "split_seed=0", "min_interactions=5"):
        assert argument in doc
    for key in ("user_id", "candidate_ids", "user_features", "candidate_features"):
        assert f"``{key}``" in doc
