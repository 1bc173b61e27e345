"""A hub per DC: the gateway that replicates a home hub's versions into its DC (`python -m rlsync.hub.federation`)."""
