"""Issue 30 item 5: errors at the deadline name their real cause. A re-plan the hub holds back for a
stalled sole holder is answered, typed (HolderWaitTimeoutError, naming the version and the wait), before
the client's try runs out — not `HubUnavailableError` from a hub that is up; and `hub_deadline_s` bounds
a call to a hub that went away, also below the RPC try time."""
import os
import signal
import threading
import time

import pytest
import torch

from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
from rlsync.hub import errors as E
from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.tools.demo import start_hub_process
from rlsync.hub.tools.procs import WorkerProcess, close_all
from rlsync.hub.server.loop import start_embedded_hub
from rlsync.hub.state import HubConfig

pytestmark = pytest.mark.timeout(120)


def test_a_parked_replan_past_the_clients_try_is_a_typed_timeout_naming_the_version():
    with start_embedded_hub(config=HubConfig(worker_timeout_s=60.0)) as hub:
        trainer = WorkerProcess(hub.address, hub.token, ClientConfig(
            transport="tcp-py", manifest=ManifestConfig(chunk_bytes=256 << 10),
            dataplane=DataPlaneConfig(serve_delay_s=0.05)), name="trainer")
        try:
            trainer.join(host="t")
            trainer.call("publish", model="policy", version=3, size_mb=4, seed=1)
            reader = HubClient(hub.address, hub.token, config=ClientConfig(
                transport="tcp-py", rpc_timeout_s=3.0, dataplane=DataPlaneConfig(io_timeout_s=1.0)))
            reader.join(Location(host="r"))
            out: dict = {}

            def fetch() -> None:
                t0 = time.monotonic()
                try:
                    reader.fetch("policy", 3)
                except BaseException as e:  # noqa: BLE001 - asserted below
                    out["err"], out["s"] = e, time.monotonic() - t0

            th = threading.Thread(target=fetch)
            th.start()
            deadline = time.monotonic() + 30
            while not any(x["readers"] for x in trainer.call("served").values()):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            os.kill(trainer.proc.pid, signal.SIGSTOP)  # stalled, not dead: the port still accepts
            try:
                th.join(30)
            finally:
                os.kill(trainer.proc.pid, signal.SIGCONT)
            err = out.get("err")
            assert isinstance(err, E.HolderWaitTimeoutError), repr(err)
            assert isinstance(err, E.VersionLostError)  # callers catching 'lost' still do
            assert "'policy' v3" in str(err) and "waited" in str(err)
            # io timeout (1 s) + the park (0.8 x the 3 s try), never the 3 s try's HubUnavailableError
            assert out["s"] < 1.0 + 3.0 + 1.5, out["s"]
            reader.leave()
        finally:
            close_all([trainer])


def test_hub_deadline_bounds_a_call_to_a_hub_that_went_away(tmp_path):
    proc, address, token = start_hub_process(str(tmp_path))
    try:
        c = HubClient(address, token, config=ClientConfig(hub_deadline_s=2.0, rpc_timeout_s=10.0))
        assert c.stats()["workers"] == 0  # answered once: from now on the deadline applies
    finally:
        proc.kill()
        proc.wait()
    t0 = time.monotonic()
    with pytest.raises(E.HubUnavailableError):
        c.latest("policy")
    took = time.monotonic() - t0
    assert took < 2.0 + 1.0, took  # not the 10 s try
    c.leave()
