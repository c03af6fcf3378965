"""FEL's first stage: partition the clients into disjoint clusters using public features only.

Every function returns ``(U,)`` int64 cluster ids in ``0..K-1`` with every cluster non-empty, so
each client is in exactly one cluster; all are deterministic given their arguments (and seed).

- :func:`random_clusters`: a seeded, balanced random assignment (ignores the features).
- :func:`feature_clusters`: one cluster per distinct value of a public feature or of a cross of
  several (e.g. gender x age level), numbered in sorted order of the values.
- :func:`kmeans_clusters`: k-means on the one-hot encoded public features. scikit-learn is not a
  dependency of the project, so this is a small NumPy k-means (k-means++ seeding, Lloyd steps,
  empty clusters re-seeded at the farthest point); clients with equal public features always land
  in the same cluster.
"""

from __future__ import annotations

import numpy as np


def random_clusters(num_clients: int, num_clusters: int, *, seed: int = 0) -> np.ndarray:
    """A balanced random partition (sizes differ by at most one)."""
    if not 1 <= num_clusters <= num_clients:
        raise ValueError(
            f"need 1 <= num_clusters <= num_clients, got {num_clusters}, {num_clients}"
        )
    rng = np.random.default_rng(seed)
    return (rng.permutation(num_clients) % num_clusters).astype(np.int64)


def feature_clusters(public: np.ndarray, columns: list[int] | tuple[int, ...]) -> np.ndarray:
    """One cluster per distinct value of ``public[:, columns]`` (a single feature or a cross)."""
    public = np.asarray(public)
    if public.ndim != 2 or not columns:
        raise ValueError("public must be (U, P) and columns non-empty")
    _, ids = np.unique(public[:, list(columns)], axis=0, return_inverse=True)
    return ids.reshape(-1).astype(np.int64)


def one_hot(public: np.ndarray) -> np.ndarray:
    """(U, sum of distinct values per column) one-hot encoding of categorical codes."""
    public = np.asarray(public)
    blocks = []
    for col in public.T:
        _, ids = np.unique(col, return_inverse=True)
        blocks.append(np.eye(int(ids.max()) + 1)[ids.reshape(-1)])
    return np.concatenate(blocks, axis=1)


def _profile_keys(public: np.ndarray) -> np.ndarray:
    """(U,) one integer per client, equal exactly when the rows of codes are equal."""
    key = np.zeros(len(public), dtype=np.int64)
    radix = 1
    for col in public.T:
        _, ids = np.unique(col, return_inverse=True)
        size = int(ids.max()) + 1 if len(ids) else 1
        radix *= size
        if radix >= 2**62:  # too many combinations for one int64: rank the rows instead
            return np.unique(public, axis=0, return_inverse=True)[1].reshape(-1)
        key = key * size + ids.reshape(-1)
    return key


def kmeans_clusters(
    public: np.ndarray, num_clusters: int, *, seed: int = 0, iterations: int = 50
) -> np.ndarray:
    """k-means on the one-hot public features (NumPy; see the module docstring)."""
    public = np.asarray(public)
    # The distinct profiles, found on one integer key per client (np.unique over the rows of the
    # (U, D) one-hot matrix sorts them lexicographically: seconds at 100,000 clients).
    _, first, inverse = np.unique(_profile_keys(public), return_index=True, return_inverse=True)
    points = one_hot(public)[first] if len(first) else np.zeros((0, 0))
    weights = np.bincount(inverse.reshape(-1), minlength=len(points)).astype(np.float64)
    if not 1 <= num_clusters <= len(points):
        raise ValueError(
            f"need 1 <= num_clusters <= {len(points)} (the distinct public profiles), got {num_clusters}"
        )
    rng = np.random.default_rng(seed)

    def sq_dist(centres: np.ndarray) -> np.ndarray:
        return ((points[:, None, :] - centres[None, :, :]) ** 2).sum(-1)

    # k-means++ over the distinct profiles, weighted by how many clients share each
    centres = [points[rng.choice(len(points), p=weights / weights.sum())]]
    for _ in range(1, num_clusters):
        d = sq_dist(np.array(centres)).min(1) * weights
        centres.append(points[rng.choice(len(points), p=d / d.sum())])
    centres = np.array(centres)
    labels = np.full(len(points), -1)
    for _ in range(iterations):
        dist = sq_dist(centres)
        new = dist.argmin(1)
        for k in range(num_clusters):  # re-seed an empty cluster at the farthest profile
            if not (new == k).any():
                far = int((dist[np.arange(len(points)), new] * (weights > 0)).argmax())
                new[far] = k
                centres[k] = points[far]
        if np.array_equal(new, labels):
            break
        labels = new
        for k in range(num_clusters):
            member = labels == k
            if member.any():
                centres[k] = (points[member] * weights[member, None]).sum(0) / weights[member].sum()
    return labels[inverse.reshape(-1)].astype(np.int64)


def cluster_clients(
    public: np.ndarray,
    public_names: tuple[str, ...],
    method: str,
    *,
    num_clusters: int | None = None,
    features: tuple[str, ...] = (),
    seed: int = 0,
) -> np.ndarray:
    """``method`` = "random" (``num_clusters``), "feature" (``features``, one or a cross) or
    "kmeans" (``num_clusters``; over ``features`` if given, else all public features)."""
    cols = [public_names.index(f) for f in features] if features else list(range(len(public_names)))
    if method == "random":
        return random_clusters(len(public), int(num_clusters or 1), seed=seed)
    if method == "feature":
        if not features:
            raise ValueError(
                "method 'feature' needs features, e.g. ('final_gender_code', 'age_level')"
            )
        return feature_clusters(public, cols)
    if method == "kmeans":
        return kmeans_clusters(np.asarray(public)[:, cols], int(num_clusters or 1), seed=seed)
    raise ValueError(f"unknown clustering method {method!r}; known: random, feature, kmeans")
