"""Registry rows of the logged-data environments (entry points as strings: nothing heavy on import)."""

from __future__ import annotations

from fedrec.env_entry import EnvEntry

_SINGLE = "fedrec.envs.datasets.environments:make_logged_env"
_VECTOR = "fedrec.envs.datasets.environments:make_logged_vector_env"

_INTERACTION_DATASETS = (
    ("fedrec/MovieLens100K-v0", "ml-100k", "MovieLens 100K"),
    ("fedrec/MovieLens1M-v0", "ml-1m", "MovieLens 1M"),
    ("fedrec/Lastfm2K-v0", "lastfm-2k", "Lastfm 2K (HetRec 2011)"),
    ("fedrec/FoursquareNYC-v0", "foursquare-nyc", "Foursquare NYC check-ins"),
)

#: The logged-data ids; pass ``data_dir=...`` (default ``$FEDREC_DATA`` or ``~/.cache/fedrec``) and
#: ``mode="interaction"`` (default) or ``mode="evaluation"`` (leave-one-out HR@K / NDCG@K).
LOGGED_DATA_ENVIRONMENTS: tuple[EnvEntry, ...] = (
    *(
        EnvEntry(
            id=env_id,
            api="gymnasium",
            entry_point=_SINGLE,
            vector_entry_point=_VECTOR,
            kwargs={"dataset": dataset},
            description=f"{title} log: slates replayed against a user's logged positives; "
            "mode='evaluation' for leave-one-out HR@K.",
        )
        for env_id, dataset, title in _INTERACTION_DATASETS
    ),
    EnvEntry(
        id="fedrec/TaobaoAds-v0",
        api="gymnasium",
        entry_point="fedrec.envs.datasets.taobao:TaobaoAdsEnv",
        vector_entry_point="fedrec.envs.datasets.taobao:TaobaoAdsVectorEnv",
        description="Taobao display-ad impressions: score each logged (user, ad, context); "
        "reward is the logged click, AUC in fedrec.eval.",
    ),
)
