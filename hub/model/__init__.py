"""The hub's vocabulary: where a worker is, which shard, which replica, what a version holds (manifests, units, checksums). Pure: no I/O, no sockets."""
