"""Issue 20: a real 2-rank DeepSpeed ZeRO-3 trainer publishes its live partitions as shards (no gather);
a whole-tensor reader and a TP=2 reader group (fused qkv / gate_up row blocks, o / down column blocks)
read them bit-exact against the gathered weights, and each rank served only its own partition.

Two DeepSpeed processes: ~20 s on an idle machine (their start-up), minutes under heavy load.
"""
import os

import pytest

from rlsync.bench.reshard import Ranks, expected_tp, same_bytes, tp_dests, VOCAB
from rlsync.hub import HubClient, Location, start_embedded_hub
from rlsync.hub.model.manifest import dtype_name
from rlsync.hub.reshard.layout import record, zero3_layout
from rlsync.hub.reshard.read import ReshardReader
from rlsync.rollout import TinyModelConfig, build_tiny_model

MODEL = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128, "max_position_embeddings": 32}


@pytest.mark.timeout(900)
def test_zero3_ranks_publish_shards_and_readers_reshard_them_exactly(tmp_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    shapes = {n: (tuple(p.shape), dtype_name(p.dtype))
              for n, p in build_tiny_model(TinyModelConfig(**MODEL), VOCAB).named_parameters()}
    layout = zero3_layout(shapes, 2)
    hub = start_embedded_hub(journal=str(tmp_path / "j.db"))
    ranks, clients = None, []

    def client(name):
        c = HubClient(hub.address, hub.token)
        c.join(Location(host="h0"), name)
        clients.append(c)
        return c

    try:
        ranks = Ranks(hub.address, hub.token, MODEL)
        ranks.run("sharded", 1)      # each rank: its own partition, no collective
        ranks.run("gathered", 1)     # the baseline: all-gather, rank 0 publishes the full copy
        ref = client("reference").fetch("policy_gathered", 1).tensors
        assert set(ref) == set(shapes)

        whole = ReshardReader(client("whole"), "policy", layout).read_whole("latest")
        assert whole.version == 1
        for n in shapes:
            assert same_bytes(whole.tensors[n], ref[n]), n
        # Bytes per source: each rank served exactly its partition (padding left out) and its record.
        want = {ranks.worker_ids[r]: sum(p.length * 4 for p in layout.ranks[r]) + len(record(layout, r))
                for r in range(2)}
        assert whole.bytes_by_source == want
        assert max(want.values()) < 0.6 * sum(p.length * 4 for r in layout.ranks for p in r)

        for k in range(2):
            dests = tp_dests(list(shapes), k)
            assert any(".qkv_proj." in d.name for d in dests) and any(".down_proj." in d.name for d in dests)
            got = ReshardReader(client(f"tp{k}"), "policy", layout).read(1, dests)
            for n, t in expected_tp(ref, dests).items():
                assert same_bytes(got.tensors[n], t), n
    finally:
        for c in clients:
            c.leave()
        if ranks is not None:
            ranks.close()
        hub.stop()
