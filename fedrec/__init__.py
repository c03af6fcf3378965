"""fedrec: federated and cross-platform recommendation with reinforcement learning.

Importing the package registers every environment with Gymnasium and PettingZoo::

    import gymnasium as gym
    import fedrec

    env = gym.make("fedrec/ChocKale-v0")
    envs = gym.make_vec("fedrec/ChocKale-v0", num_envs=4096)
"""

from fedrec._version import __version__
from fedrec.registration import ENVIRONMENTS, environment_ids, register_all

register_all()

__all__ = ["ENVIRONMENTS", "__version__", "environment_ids", "register_all"]
