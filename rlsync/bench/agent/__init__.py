"""The benchmark's agents: one process per emulated host, driven over stdin/stdout.

`protocol.py` is what the benchmark and the agents share (command registry, `Agent` handle, `STATE`);
`__main__.py` is the agent loop; each `cmd_*.py` registers one system's commands.
"""
