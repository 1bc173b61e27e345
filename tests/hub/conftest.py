import pytest

from rlsync.hub import HubClient, Location, start_embedded_hub


def pytest_configure(config):
    config.addinivalue_line("markers", "rdma: needs an RDMA device (skipped without one, with the reason)")
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one, with the reason)")


@pytest.fixture
def hub(tmp_path):
    h = start_embedded_hub(journal=str(tmp_path / "journal.db"))
    yield h
    h.stop()


@pytest.fixture
def make_client(hub):
    clients = []

    def make(host="h0", dc="dc0", rack="r0", name="worker", config=None, join=True):
        c = HubClient(hub.address, hub.token, config=config)
        if join:
            c.join(Location(dc=dc, rack=rack, host=host), name)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.leave()
