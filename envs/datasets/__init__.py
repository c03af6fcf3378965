"""Logged recommendation data sets: loaders, fetching, preprocessing and interaction environments."""
