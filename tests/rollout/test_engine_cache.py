"""The vLLM start-up cache as a hub artifact (rollout/vllm/engine_cache.py): made by one worker, taken by a
joiner through a real hub on loopback, checked file by file, immutable per key. No vLLM needed."""
import os

import pytest
import torch

from rlsync.hub import HubClient, Location, start_embedded_hub
from rlsync.rollout.vllm import engine_cache as EC


@pytest.fixture
def make_client(tmp_path):
    hub = start_embedded_hub(journal=str(tmp_path / "journal.db"))
    clients = []

    def make(host="h0", name="worker"):
        c = HubClient(hub.address, hub.token)
        c.join(Location(host=host), name)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.leave()
    hub.stop()



def _tree(root, files):
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def _read(root):
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.relpath(os.path.join(d, f), root)] = fh.read()
    return out


FILES = {"modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json": b'{"hash": "d0"}',
         "torch_compile_cache/abc/rank_0/model": bytes(range(256)) * 10}


def test_a_joiner_takes_the_cache_from_the_worker_that_made_it(tmp_path, make_client):
    maker, joiner = make_client(host="a", name="cold"), make_client(host="b", name="warm")
    _tree(tmp_path / "made", FILES)
    held = EC.publish_cache(maker, str(tmp_path / "made"), "k1")
    assert held is not None
    written = EC.fetch_cache(joiner, "k1", str(tmp_path / "fresh"))
    assert sorted(written) == sorted(FILES) and _read(tmp_path / "fresh") == FILES
    # while a live peer serves it, a second maker publishes nothing: the version stays the first one's
    other = make_client(host="c", name="cold2")
    _tree(tmp_path / "other", {"modelinfos/x.json": b"other"})
    assert EC.publish_cache(other, str(tmp_path / "other"), "k1") is None
    assert other.versions(EC.artifact_model("k1"))["committed"] == [1]
    # no artifact under another key: the joiner starts cold, nothing written
    assert EC.fetch_cache(joiner, "k2", str(tmp_path / "none")) == []
    assert not (tmp_path / "none").exists()


def test_when_every_holder_left_a_joiner_starts_cold_and_the_next_maker_publishes_a_new_version(tmp_path, make_client):
    first = make_client(host="a", name="cold")
    _tree(tmp_path / "made", FILES)
    assert EC.publish_cache(first, str(tmp_path / "made"), "k4") is not None
    first.leave()  # its replica goes with it (a killed spot worker)
    joiner = make_client(host="b", name="warm")
    assert EC.fetch_cache(joiner, "k4", str(tmp_path / "fresh")) == []
    assert EC.publish_cache(joiner, str(tmp_path / "made"), "k4") is not None
    assert joiner.versions(EC.artifact_model("k4"))["committed"] == [1, 2]
    assert EC.fetch_cache(make_client(host="c"), "k4", str(tmp_path / "again")) == sorted(FILES)


def test_an_empty_cache_publishes_nothing(tmp_path, make_client):
    (tmp_path / "empty").mkdir()
    assert EC.publish_cache(make_client(), str(tmp_path / "empty"), "k3") is None


def test_a_tampered_file_writes_nothing_and_existing_files_are_kept(tmp_path):
    _tree(tmp_path / "made", FILES)
    t = EC.pack(str(tmp_path / "made"))
    bad = {"index": t["index"], "blob": t["blob"].clone()}
    bad["blob"][-1] ^= 1
    with pytest.raises(EC.EngineCacheError, match="sha256"):
        EC.unpack(bad, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    _tree(tmp_path / "out", {"modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json": b"mine"})
    assert EC.unpack(t, str(tmp_path / "out")) == ["torch_compile_cache/abc/rank_0/model"]
    assert _read(tmp_path / "out")["modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json"] == b"mine"


def test_a_path_leaving_the_root_is_refused(tmp_path):
    import json
    index = json.dumps([["../evil", 1, __import__("hashlib").sha256(b"x").hexdigest()]]).encode()
    t = {"index": torch.frombuffer(bytearray(index), dtype=torch.uint8),
         "blob": torch.frombuffer(bytearray(b"x"), dtype=torch.uint8)}
    with pytest.raises(EC.EngineCacheError, match="leaves"):
        EC.unpack(t, str(tmp_path / "root"))
    assert not (tmp_path / "evil").exists()


def test_a_weightless_dir_keeps_config_and_tokenizer_and_no_weights(tmp_path):
    from rlsync.rollout.vllm.model_dir import weightless_dir

    _tree(tmp_path / "model", {"config.json": b"{}", "tokenizer.json": b"{}", "chat_template.jinja": b"x",
                               "model.safetensors": b"w" * 64, "rlsync-ready": b""})
    out = weightless_dir(str(tmp_path / "model"), str(tmp_path / "bare"))
    assert sorted(os.listdir(out)) == ["chat_template.jinja", "config.json", "tokenizer.json"]


def test_the_compile_cache_lives_under_the_engine_cache_root_unless_the_process_chose_one(tmp_path, monkeypatch):
    # vLLM compiles its sampler's log-prob kernel with inductor even when eager; torch's default cache is the
    # machine's /tmp, which the artifact (the cache root's files) never carried
    pytest.importorskip("vllm", reason="vLLM is installed by scripts/run (RLSYNC_VLLM=none skips it)")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert EC.use_engine_compile_cache() == str(tmp_path / "vllm" / "inductor")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "vllm" / "inductor")
    # torch writes its default there when torch._dynamo is imported (`import vllm` does): not a choice
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert EC.use_engine_compile_cache() == str(tmp_path / "vllm" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert EC.use_engine_compile_cache() == str(tmp_path / "mine")


def test_the_key_names_the_cpu_instruction_set_the_compiled_kernels_use(tmp_path, monkeypatch):
    pytest.importorskip("vllm", reason="vLLM is installed by scripts/run (RLSYNC_VLLM=none skips it)")
    from rlsync.rollout.vllm.engine import VllmEngine

    (tmp_path / "config.json").write_text("{}")
    cfg = VllmEngine.Config(model_dir=str(tmp_path))
    here = EC.cache_key(str(tmp_path), cfg)
    assert EC.cache_key(str(tmp_path), cfg) == here
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    avx2 = EC.cache_key(str(tmp_path), cfg)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert avx2 != EC.cache_key(str(tmp_path), cfg)
