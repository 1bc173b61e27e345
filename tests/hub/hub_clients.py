"""Test helper shared by the federation tests: a maker of hub clients that joins them where asked and keeps them."""
from rlsync.hub import HubClient, Location


def client_maker(cfg, clients: list):
    """client(hub, dc, host): a client of `hub`, joined in `dc` when `host` is given, kept in `clients`."""
    def client(hub, dc, host):
        c = HubClient(hub.address, hub.token, config=cfg)
        clients.append(c)
        if host:
            c.join(Location(dc=dc, host=host))
        return c
    return client
