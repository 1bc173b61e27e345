"""Hydra configs of `python -m rlsync.train`, shipped as package data (`rlsync.configs`)."""
