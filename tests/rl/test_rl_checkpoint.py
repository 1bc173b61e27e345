"""CheckpointStore: commit marks complete, latest / resolve, pruning. Pure files, milliseconds."""
import pytest

from rlsync.driver.checkpoint import DRIVER_STATE, CheckpointStore


def test_commit_latest_prune_and_resolve(tmp_path):
    s = CheckpointStore(tmp_path / "ck", keep=2)
    assert s.latest() is None and s.resolve("auto") is None and s.resolve("never") is None
    for step in (10, 20, 30):
        s.path_for(step).mkdir(parents=True)
        s.commit(step, {"step": step, "task": {"cursor": step * 8, "seed": 0}})
    assert [p.name for p in s.committed()] == ["step_0000020", "step_0000030"]
    path, state = s.resolve("auto")
    assert path == s.path_for(30) and state["task"]["cursor"] == 240
    assert s.resolve(str(s.path_for(20)))[1]["step"] == 20


def test_a_checkpoint_without_driver_state_does_not_count(tmp_path):
    s = CheckpointStore(tmp_path, keep=3)
    s.path_for(5).mkdir(parents=True)
    s.commit(5, {"step": 5})
    s.path_for(6).mkdir(parents=True)          # crashed mid-save: trainer files only
    (s.path_for(6) / "trainer.pt").write_bytes(b"x")
    assert s.latest()[1]["step"] == 5
    with pytest.raises(FileNotFoundError, match=DRIVER_STATE):
        s.resolve(str(s.path_for(6)))
