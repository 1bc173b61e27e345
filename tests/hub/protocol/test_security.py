"""Security: the journal and the signing key are private, and a ticket is usable only by its reader.

Each test here failed on ea01902: the journal's -wal/-shm were created 0644 with the Ed25519 key in
them (user `nobody` read it), and a data-plane server served any request carrying a ticket — forged
with that key, someone else's, or a replay after the reader left.
"""
import os
import socket
import subprocess
import tempfile
import time

import msgpack
import pytest
import torch

from rlsync.hub import HubClient, Location, start_embedded_hub
from rlsync.hub import errors as E
from rlsync.hub.dataplane.wire import MAGIC, REQ, UNIT
from rlsync.hub.server.journal import Journal
from rlsync.hub.server.loop import KEY_SUFFIX
from rlsync.hub.protocol.tickets import ReaderKey, Ticket, TicketSigner

W = {"w": torch.arange(4096, dtype=torch.float32)}
NOBODY = 65534


@pytest.fixture
def open_dir():
    """A directory every user may enter (pytest's tmp_path is 0700: it would hide our mistakes)."""
    d = tempfile.mkdtemp(prefix="rlsync-sec-")
    os.chmod(d, 0o755)
    yield d
    subprocess.run(["rm", "-rf", d], check=False)


def modes(d: str) -> dict[str, int]:
    return {f: os.stat(os.path.join(d, f)).st_mode & 0o777 for f in sorted(os.listdir(d))}


def readable_by_nobody(paths: list[str]) -> list[str]:
    """Which of `paths` user `nobody` can read (`cat` in a child process that drops to it)."""
    return [p for p in paths if subprocess.run(["/bin/cat", p], user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                                               capture_output=True, timeout=30).returncode == 0]


def assert_private(d: str, key: bytes) -> None:
    files = modes(d)
    assert files and all(m == 0o600 for m in files.values()), files
    assert readable_by_nobody([os.path.join(d, f) for f in files]) == []
    for f in files:  # the key is in its own file, nowhere in the journal
        if not f.endswith(KEY_SUFFIX):
            assert key not in open(os.path.join(d, f), "rb").read(), f


def publish_some(hub, versions) -> None:
    c = HubClient(hub.address, hub.token)
    c.join(Location(host="t"))
    for v in versions:
        c.publish("policy", v, {k: t.clone() for k, t in W.items()})
    c.leave()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to user nobody")
def test_journal_and_key_are_private_while_running_and_after_restart(open_dir):
    control = os.path.join(open_dir, "control")
    open(control, "w").close()
    os.chmod(control, 0o644)
    assert readable_by_nobody([control]) == [control]  # the probe does see a readable file
    os.unlink(control)
    journal = os.path.join(open_dir, "hub.db")
    hub = start_embedded_hub(journal=journal)
    try:
        publish_some(hub, [1, 2])
        assert {"hub.db", "hub.db-wal", "hub.db-shm", "hub.db" + KEY_SUFFIX} <= set(modes(open_dir))
        key = hub.server.signer.private_bytes
        assert_private(open_dir, key)
    finally:
        hub.stop()
    assert_private(open_dir, key)
    hub = start_embedded_hub(journal=journal)  # restart on the same journal: same key, still private
    try:
        assert hub.server.signer.private_bytes == key
        publish_some(hub, [3])
        assert_private(open_dir, key)
    finally:
        hub.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to user nobody")
def test_a_journal_with_the_key_inside_is_migrated_and_scrubbed(open_dir):
    journal = os.path.join(open_dir, "old.db")
    old = Journal(journal)  # what an older hub left: the key in meta, side files 0644
    legacy = TicketSigner().private_bytes
    old.set_meta("ticket_key", legacy)
    for f in os.listdir(open_dir):
        os.chmod(os.path.join(open_dir, f), 0o644)
    old._db.close()
    hub = start_embedded_hub(journal=journal)
    try:
        assert hub.server.signer.private_bytes == legacy  # tickets signed before stay valid
        assert hub.server.journal.get_meta("ticket_key") is None
        assert_private(open_dir, legacy)
    finally:
        hub.stop()
    assert_private(open_dir, legacy)


# ----------------------------------------------------------------------------- tickets
def send(endpoint: str, body: bytes, kind: int = 1):
    """One raw data-plane request; returns (status, code-or-None, text) of the first frame."""
    host, port = endpoint.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        s.sendall(REQ.pack(MAGIC, 1, kind, 0, len(body)) + body)
        unit, status, n = UNIT.unpack(s.recv(UNIT.size, socket.MSG_WAITALL))
        if status != 0:
            code, text = msgpack.unpackb(s.recv(n, socket.MSG_WAITALL))
            return status, code, text
        return status, None, ""
    finally:
        s.close()


@pytest.fixture
def planned(hub, make_client):
    """A trainer holding v1, and a genuine ticket the hub issued to `reader` for it."""
    trainer = make_client(host="t", name="trainer")
    trainer.publish("policy", 1, W)
    reader = make_client(host="r", name="reader")
    plan = reader.session.rpc.call("fetch", wid=reader.worker_id, model="policy", version=1,
                            shard=[0, 0, 1, 1], group=None, into_spec=None)
    src = plan["sources"][0]
    assert src["worker"] == trainer.worker_id
    return trainer, reader, src


def served(trainer) -> int:
    return sum(r.units_served for r in trainer.store.all())


def test_the_reader_named_in_the_ticket_is_served(planned):
    trainer, reader, src = planned
    body = reader.session.reader_key.sign_request(src["ticket"], src["replica"], [0])
    assert send(src["endpoint"]["tcp"], body)[0] == 0


def test_another_processes_use_of_a_genuine_ticket_is_refused(planned):
    trainer, reader, src = planned
    thief = ReaderKey()  # a process that captured the ticket: it has no session key of `reader`
    status, code, text = send(src["endpoint"]["tcp"], thief.sign_request(src["ticket"], src["replica"], [0]))
    assert (status, code) == (1, "ticket") and "someone else's ticket" in text
    bare = msgpack.packb({"ticket": src["ticket"], "replica": src["replica"], "units": [0]})  # no proof at all
    status, code, text = send(src["endpoint"]["tcp"], bare)
    assert (status, code) == (1, "ticket") and "proof" in text
    assert served(trainer) == 0


def test_a_replayed_request_is_refused_even_after_the_reader_left(planned):
    trainer, reader, src = planned
    body = reader.session.reader_key.sign_request(src["ticket"], src["replica"], [0])
    assert send(src["endpoint"]["tcp"], body)[0] == 0
    reader.leave()
    status, code, text = send(src["endpoint"]["tcp"], body)  # the exact bytes, captured off the wire
    assert (status, code) == (1, "ticket") and "replayed" in text
    assert served(trainer) == 1


def test_forged_and_expired_tickets_are_refused(hub, planned):
    trainer, reader, src = planned
    key, rid = reader.session.reader_key, src["replica"]
    forged = TicketSigner().sign(Ticket("f1", reader.worker_id, key.public_bytes, trainer.worker_id, rid,
                                        time.time() + 60))
    status, code, text = send(src["endpoint"]["tcp"], key.sign_request(forged, rid, [0]))
    assert code == "ticket" and "forged" in text
    expired = hub.server.signer.sign(Ticket("f1", reader.worker_id, key.public_bytes, trainer.worker_id, rid,
                                            time.time() - 1))
    status, code, text = send(src["endpoint"]["tcp"], key.sign_request(expired, rid, [0]))
    assert code == "ticket" and "expired" in text
    assert served(trainer) == 0


def test_tickets_live_seconds_not_minutes(hub, planned):
    assert hub.server.cfg.ticket_ttl_s <= 30


def test_a_ticket_signed_in_a_batch_proves_only_its_own_read():
    """The hub signs a loop pass's tickets under one signature (a Merkle root): each ticket still
    verifies only for its own source and replica, and no byte of it can change (body, index, leaf
    count, sibling hashes, signature) without the verifier refusing it. No I/O: ~0.1 s."""
    from rlsync.hub.protocol.tickets import TicketVerifier
    signer = TicketSigner()
    verifier = TicketVerifier(signer.public_bytes)
    reader = ReaderKey().public_bytes
    for n in (1, 2, 5, 13):
        ts = [Ticket(f"f{i}", "w9", reader, f"src{i}", f"src{i}:p:1:tp0-pp0:live", time.time() + 60) for i in range(n)]
        blobs = signer.sign_many(ts)
        for t, blob in zip(ts, blobs):
            assert verifier.verify(blob, source=t.source, replica=t.replica) == t
        j = n // 2
        if n > 1:
            with pytest.raises(E.TicketError):
                verifier.verify(blobs[j], source=ts[j - 1].source, replica=ts[j - 1].replica)
        for k in range(len(blobs[j])):
            bad = bytearray(blobs[j])
            bad[k] ^= 0x01
            with pytest.raises(E.TicketError):
                verifier.verify(bytes(bad), source=ts[j].source, replica=ts[j].replica)
        with pytest.raises(E.TicketError):  # another signer's batch (another hub's key)
            verifier.verify(TicketSigner().sign_many(ts)[j], source=ts[j].source, replica=ts[j].replica)
