"""`python -m rlsync.export RUN_DIR OUT [--step N]`: a short real run's policy as a Hugging Face directory that
transformers loads with the trainer's exact logits; mistakes are one line. (vLLM: tests/vllm/test_vllm_export.py.)"""
import json
from pathlib import Path

import pytest
import torch

from rlsync.config.schema import TrainConfig, as_dict
from rlsync.driver import Driver
from rlsync.driver.checkpoint import CheckpointStore
from rlsync.export.__main__ import main as export_main
from rlsync.pool.policies import PoolConfig
from rlsync.rollout.models import ModelLoader
from rlsync.rollout.registry import register_model_loader
from rlsync.telemetry.loggers import RUN_CONFIG_FILE
from rlsync.workers.policy import build_policy


@pytest.fixture(scope="module")
def run(ray_address, tmp_path_factory):
    """A 3-step run of the default tiny Llama on `reverse`, checkpoints at steps 2 and 3."""
    cfg = TrainConfig(steps=3, run_dir=str(tmp_path_factory.mktemp("export") / "run"), progress=False, timeout_s=120)
    cfg.rollout.prompts_per_step, cfg.rollout.group_size = 4, 4
    cfg.pools = {"main": PoolConfig(size=1)}
    cfg.logging.wandb.enabled = False
    cfg.checkpoint.every = 2
    cfg.trainer.algo.optimizer.lr = 1e-2  # big steps: trained weights are far from the init
    Driver(cfg, cfg.run_dir).run()
    return cfg


def _trainer_model(cfg, step: int):
    """The policy as the trainer held it at `step`: the run's model with that checkpoint's weights."""
    model, task = build_policy(cfg.model, cfg.task, cfg.seed)
    model.load_state_dict(torch.load(CheckpointStore(Path(cfg.run_dir) / "checkpoints").path_for(step) / "model.pt",
                                     weights_only=True)["model"])
    return model.eval(), task


def test_export_loads_in_transformers_with_the_trainers_logits(run, tmp_path, capsys):
    import transformers

    out = tmp_path / "hf"
    assert export_main([run.run_dir, str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= set(
        p.name for p in out.iterdir())
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    trainer, task = _trainer_model(run, 3)
    init, _ = build_policy(run.model, run.task, run.seed)
    assert any(not torch.equal(a, b) for a, b in zip(trainer.state_dict().values(), init.state_dict().values()))

    tok = transformers.AutoTokenizer.from_pretrained(out)
    prompts = [task.prompt_at(i) for i in range(8)]
    ids = torch.tensor([tok.encode("<bos>" + p.text + "<sep>", add_special_tokens=False) for p in prompts])
    assert ids.tolist() == [p.prompt_ids for p in prompts]  # the exported tokenizer gives the task's ids
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, trainer(ids).logits)
        greedy = hf.generate(ids, max_new_tokens=4, do_sample=False)[:, ids.shape[1]:]
    assert tok.decode(greedy[0], skip_special_tokens=True) == task.tokenizer.decode(greedy[0].tolist())


def test_step_exports_that_checkpoint(run, tmp_path):
    from safetensors.torch import load_file

    assert export_main([run.run_dir, str(tmp_path / "s2"), "--step", "2"]) == 0
    got = load_file(tmp_path / "s2" / "model.safetensors")
    at2, at3 = (_trainer_model(run, s)[0].state_dict() for s in (2, 3))
    assert got and all(torch.equal(got[k], at2[k]) for k in got)
    assert any(not torch.equal(got[k], at3[k]) for k in got)


def test_bfloat16_export_halves_the_file(run, tmp_path):
    assert export_main([run.run_dir, str(tmp_path / "bf"), "--dtype", "bfloat16"]) == 0
    assert json.loads((tmp_path / "bf" / "config.json").read_text())["dtype"] == "bfloat16"
    f32 = export_main([run.run_dir, str(tmp_path / "f32")])
    assert f32 == 0
    ratio = (tmp_path / "bf" / "model.safetensors").stat().st_size / (tmp_path / "f32" / "model.safetensors").stat().st_size
    assert 0.45 < ratio < 0.55


@register_model_loader("test_plain_mlp")
class PlainMlpLoader(ModelLoader):
    """A model kind without a Hugging Face form (a plain torch module)."""

    def model(self, model_cfg, tokenizer, seed):
        return torch.nn.Sequential(torch.nn.Embedding(tokenizer.vocab_size, 8), torch.nn.Linear(8, tokenizer.vocab_size))


def _one_line_error(capsys, argv) -> str:
    assert export_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_mistakes_are_one_line_naming_the_fix(run, tmp_path, capsys):
    assert RUN_CONFIG_FILE in _one_line_error(capsys, [str(tmp_path), str(tmp_path / "o")])
    assert "there are: 2, 3" in _one_line_error(capsys, [run.run_dir, str(tmp_path / "o"), "--step", "7"])

    plain = tmp_path / "plain"  # a run dir in the documented layout whose model has no HF form
    cfg = TrainConfig(run_dir=str(plain))
    cfg.model.kind = "test_plain_mlp"
    plain.mkdir()
    (plain / RUN_CONFIG_FILE).write_text(json.dumps(as_dict(cfg), default=str))
    store = CheckpointStore(plain / "checkpoints")
    store.path_for(1).mkdir(parents=True)
    model, _ = build_policy(cfg.model, cfg.task, 0)
    torch.save({"model": model.state_dict(), "version": 1}, store.path_for(1) / "model.pt")
    store.commit(1, {"step": 1, "version": 1})
    err = _one_line_error(capsys, [str(plain), str(tmp_path / "o")])
    assert "model.kind=test_plain_mlp" in err and "no Hugging Face form" in err
    assert not (tmp_path / "o").exists()  # a refusal writes nothing
