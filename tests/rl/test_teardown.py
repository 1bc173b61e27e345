"""Shutting a run down leaves nothing behind even when a step fails (rlsync/driver/teardown.py)."""
from __future__ import annotations

import os
import tempfile
import types

import pytest

from rlsync.driver.loop import Driver
from rlsync.hub import ClientConfig, HubClient, start_embedded_hub
from rlsync.hub import errors as E


class _Group:
    def __init__(self, fail: bool) -> None:
        self.fail, self.stopped = fail, False

    def shutdown(self, timeout_s: float) -> None:
        self.stopped = True
        if self.fail:  # an injected fault: a worker group whose shutdown raises
            raise RuntimeError("actor died during shutdown")


def test_a_group_that_fails_to_shut_down_leaves_no_hub_client_or_journal_behind():
    tmp = tempfile.mkdtemp(prefix="rlsync-hub-")
    hub = start_embedded_hub(journal=os.path.join(tmp, "journal.db"))
    client = HubClient(hub.address, token=hub.token)
    client.stats()
    pools, trainers = _Group(fail=True), _Group(fail=False)
    d = types.SimpleNamespace(channels=None, looping=True, pools=pools, trainers=trainers,
                              _stats_client=client, hub=hub, _hub_tmp=tmp)
    with pytest.raises(RuntimeError, match="actor died during shutdown"):
        Driver._stop(d)
    assert trainers.stopped, "the trainer group was not shut down after the pools' shutdown raised"
    assert not os.path.exists(tmp), "the hub's journal dir was left behind"
    probe = HubClient(hub.address, token=hub.token, config=ClientConfig(rpc_timeout_s=1.0))
    try:
        with pytest.raises(E.HubUnavailableError):
            probe.stats()  # the embedded hub was stopped
    finally:
        probe.close()
