"""Resharding: layout maths (pure) and sharded publishes and reads."""
