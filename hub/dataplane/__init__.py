"""Bytes between workers: the transfer protocol (a data-plane server and the reader), the replica store, path choice and its calibration, the native engine build, and the transports."""
