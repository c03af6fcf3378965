"""Only oracles see the user's hidden state: a learning agent never receives it, in training or in
evaluation, on the single- and the multi-platform envs; the reference oracles still work."""

from __future__ import annotations

import numpy as np

from fedrec.agents.base import HIDDEN_STATE_KEYS, SlateAgent, visible_infos
from fedrec.agents.multi_platform import RandomMultiPolicy
from fedrec.agents.reference import RandomPolicy
from fedrec.train.loop import TrainConfig, train
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

SMALL = {"num_candidates": 10, "slate_size": 3}


class InfoSpy(RandomPolicy):
    """A random policy that records every info key it is handed."""

    seen: set[str]

    def act_batch(self, observations, *, infos=None):
        type(self).seen |= set(infos or {})
        return super().act_batch(observations, infos=infos)


class LearnerSpy(InfoSpy):
    seen: set[str] = set()


class OracleSpy(InfoSpy):
    oracle = True
    seen: set[str] = set()


def test_a_learning_agent_never_sees_the_hidden_state_but_an_oracle_does() -> None:
    # ChocKaleUserTypes-v0 has every hidden key, the user's sensitivity included
    for spy in (LearnerSpy, OracleSpy):
        spy.seen = set()
        result = train(
            lambda env, spy=spy: spy.from_env(env, seed=0),
            config=TrainConfig(
                env_id="fedrec/ChocKaleUserTypes-v0", episodes=4, num_envs=2, seed=0,
                env_kwargs=SMALL, eval_episodes=2, references=True, checkpoint_every=0,
                progress=False,
            ),
            out_dir=None,
        )  # fmt: skip
        assert "planner" in result.final_eval["policies"]  # the oracles still get what they need
    assert LearnerSpy.seen and not LearnerSpy.seen & HIDDEN_STATE_KEYS
    assert not {key.removeprefix("_") for key in LearnerSpy.seen} & HIDDEN_STATE_KEYS
    assert HIDDEN_STATE_KEYS <= OracleSpy.seen


def test_visible_infos_drops_hidden_keys_and_their_masks() -> None:
    infos = {
        "user_exposure": np.zeros(2),
        "_user_exposure": np.ones(2, bool),
        "clicked_slot": [0, 1],
    }
    learner = SlateAgent.__new__(RandomPolicy)
    assert visible_infos(learner, infos) == {"clicked_slot": [0, 1]}
    assert visible_infos(OracleSpy.__new__(OracleSpy), infos) is infos
    assert visible_infos(learner, None) is None


class JointSpy(RandomMultiPolicy):
    """A multi-platform method that records the oracle argument of every evaluation step."""

    handed: list[object] = []

    def act_joint(self, observations, oracle=None):
        type(self).handed.append(oracle)
        return super().act_joint(observations, oracle)


def test_a_multi_platform_method_is_never_handed_the_oracle_state(tmp_path) -> None:
    JointSpy.handed = []
    config = MultiPlatformTrainConfig(
        method="random", episodes=2, num_users=2, seed=0, env_kwargs=SMALL,
        eval_episodes=2, planner=True, checkpoint_every=0, progress=False,
    )  # fmt: skip
    spy = lambda env: JointSpy.from_env(env, seed=0)  # noqa: E731
    result = train_multi_platform(config, agent=spy, out_dir=tmp_path / "run")
    assert JointSpy.handed and all(oracle is None for oracle in JointSpy.handed)
    assert "planner" in result.final_eval["policies"]  # the joint planner still plans
