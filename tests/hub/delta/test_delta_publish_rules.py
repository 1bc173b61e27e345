"""Issue 30 item 6: a delta object is visible only with the version it leads to, and only from that
version's publisher; `publish_delta`'s and `fetch_delta`'s arguments are checked like every op; buffers
filled by a local copy of a held version take the next version by delta."""
import pytest
import torch

from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
from rlsync.hub import errors as E
from rlsync.hub.delta.plan import DeltaConfig
from rlsync.hub.model.names import delta_model
from rlsync.hub.server.loop import start_embedded_hub
from rlsync.hub.state import HubConfig

from test_delta import model, real_like_step  # tests/hub is on sys.path (pytest's rootdir-less import)
from books import book_agrees  # tests/hub/books.py

pytestmark = pytest.mark.timeout(120)
CFG = ClientConfig(manifest=ManifestConfig(chunk_bytes=4096, pack_below=512, pack_bytes=2048), transport="tcp-py")


@pytest.fixture
def cluster():
    hub = start_embedded_hub(config=HubConfig(delta=DeltaConfig(mode="always")))
    clients = []

    def make(host):
        c = HubClient(hub.address, hub.token, config=CFG)
        c.join(Location(host=host), host)
        clients.append(c)
        return c

    yield hub, make
    for c in clients:
        c.leave()
    hub.stop()


def committed(c, name):
    try:
        return c.versions(name)["committed"]
    except E.UnknownModelError:
        return []


def test_a_delta_by_someone_else_stays_invisible_and_the_publishers_delta_wins(cluster):
    hub, make = cluster
    t, rogue, r = make("t"), make("rogue"), make("r")
    live = model(0)
    t.publish("p", 1, live)
    t.publish_delta("p", 1, live)             # takes the copy it encodes v2 from
    buf = r.fetch("p").tensors
    t.release("p", 1)
    v2 = real_like_step(live, 1)
    # another client publishes a delta "of v2" (from its own idea of v1) and never publishes p v2
    junk = {n: x.clone() for n, x in v2.items()}
    junk["w"].view(torch.uint8)[:64] ^= 0xFF
    rogue.publish_delta("p", 1, {n: x.clone() for n, x in live.items()})
    rogue.publish_delta("p", 2, junk)
    assert 2 not in committed(r, delta_model("p"))  # pending: p v2 is not committed
    for n, x in live.items():
        x.copy_(v2[n])
    assert t.publish_delta("p", 2, live)["base"] == 1  # the real publisher's delta replaces the pending one
    t.publish("p", 2, live)
    assert 2 in committed(r, delta_model("p"))
    got = r.fetch_delta("p", into=buf)
    assert got.mode == "delta" and got.version == 2
    assert all(torch.equal(buf[n], v2[n]) for n in v2)
    book_agrees(hub, r)


def test_a_delta_from_a_non_publisher_after_the_commit_or_below_latest_is_refused(cluster):
    hub, make = cluster
    t, other = make("t"), make("other")
    live = model(1)
    t.publish("p", 1, live)
    t.publish_delta("p", 1, live)
    t.release("p", 1)
    for n, x in real_like_step(live, 1).items():
        live[n].copy_(x)
    t.publish("p", 2, live)
    other.publish_delta("p", 1, {n: x.clone() for n, x in live.items()})  # its copy only: nothing sent
    with pytest.raises(E.VersionError, match="about to be published"):
        other.publish_delta("p", 2, live)  # p v2 is committed, and `other` did not publish it
    assert 2 not in committed(t, delta_model("p"))
    assert t.publish_delta("p", 2, live)["base"] == 1  # its publisher, after the commit: accepted
    assert 2 in committed(t, delta_model("p"))


def test_a_delta_whose_base_was_never_committed_is_refused(cluster):
    hub, make = cluster
    t = make("t")
    live = model(2)
    t.publish_delta("p", 0, live)  # the first call takes the copy only
    with pytest.raises(E.VersionNotFoundError, match="base"):
        t.publish_delta("p", 1, live)  # a delta from v0, which was never published
    assert committed(t, delta_model("p")) == [] and committed(t, "p") == []
    assert t.held() == []


@pytest.mark.parametrize("keep", [-1, 0, "x", 1.5, True])
def test_keep_is_checked(cluster, keep):
    hub, make = cluster
    t = make("t")
    live = model(3)
    with pytest.raises(E.InvalidArgumentError, match="keep"):
        t.publish_delta("p", 1, live, keep=keep)
    with pytest.raises(E.InvalidArgumentError, match="keep"):
        t.fetch_delta("p", 1, into=live, keep=keep)
    with pytest.raises(E.InvalidArgumentError, match="keep"):
        t.publish_fetched_delta("p", 1, {}, keep=keep)
    assert t.held() == []


def test_publish_delta_of_a_version_not_after_its_last_one_is_refused(cluster):
    hub, make = cluster
    t = make("t")
    live = model(4)
    t.publish("p", 3, live)
    t.publish_delta("p", 3, live)
    with pytest.raises(E.VersionError, match="not after"):
        t.publish_delta("p", 2, live)
    with pytest.raises(E.VersionError, match="not after"):
        t.publish_delta("p", 3, live)


def test_buffers_filled_by_a_local_copy_take_the_next_version_by_delta(cluster):
    hub, make = cluster
    t, r = make("t"), make("r")
    live = model(5)
    t.publish("p", 1, live)
    t.publish_delta("p", 1, live)
    r.fetch("p")                                         # r holds v1 (its own buffers)
    copy = {n: torch.empty_like(x) for n, x in live.items()}
    assert r.fetch("p", 1, into=copy).nbytes == 0        # a local copy: not a second replica of v1
    t.release("p", 1)
    v2 = real_like_step(live, 1)
    for n, x in live.items():
        x.copy_(v2[n])
    t.publish_delta("p", 2, live)
    t.publish("p", 2, live)
    got = r.fetch_delta("p", 2, into=copy)
    assert got.mode == "delta" and got.nbytes < got.manifest.nbytes // 4, (got.mode, got.nbytes)
    assert all(torch.equal(copy[n], v2[n]) for n in v2)
    book_agrees(hub, r)
