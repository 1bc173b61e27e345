"""The client's replica book against the hub's (white-box: an embedded hub's state), for tests that
check that a refusal changes nothing (issue 30)."""


def hub_book(hub, wid: str) -> set[str]:
    """The full replicas the hub lists for worker `wid` (white-box: the embedded hub's state)."""
    for _ in range(50):
        try:
            return {rid for rid, r in list(hub.server.state.replicas.items()) if r.worker == wid and r.full}
        except RuntimeError:  # the hub thread changed the table while we copied it
            continue
    raise AssertionError("could not read the hub's replica table")


def book_agrees(hub, client) -> None:
    mine = {rid for rid in client.held() if (rep := client.store.get(rid)) is not None and rep.complete}
    assert set(client.held()) == mine, "the client lists replicas its store does not hold in full"
    assert mine == hub_book(hub, client.worker_id), "client and hub disagree on what this worker holds"
