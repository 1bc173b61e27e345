"""Per-token version spans: `version_spans`, `Batch.token_versions` validation, `Rollout.to_batch`, the trace event."""

import json

import pytest
import torch

from rlsync.core.batch import Batch, BatchError, span_counts, version_spans
from rlsync.rollout.engine import Rollout
from rlsync.telemetry.trace import TraceWriter


def t(*xs):
    return torch.tensor(xs)


@pytest.mark.parametrize("versions, mask, spans", [
    # prompt tokens (mask 0) carry any version and are not counted; indices count response tokens
    ((9, 3, 3, 3), (0, 1, 1, 1), [(3, 0, 2)]),
    ((9, 3, 3, 4, 4, 4), (0, 1, 1, 1, 1, 1), [(3, 0, 1), (4, 2, 4)]),
    ((5, 5, 6, 7, 0), (1, 1, 1, 1, 0), [(5, 0, 1), (6, 2, 2), (7, 3, 3)]),   # two switches; padding after
    ((4,), (1,), [(4, 0, 0)]),
    ((9, 9), (0, 0), []),                                                      # empty response: no span
])
def test_version_spans_cases(versions, mask, spans):
    assert version_spans(t(*versions), t(*mask)) == spans
    assert int(span_counts(t(*versions).view(1, -1), t(*mask).view(1, -1))[0]) == len(spans)


def batch(token_versions=None, versions=(3, 3), **kw):
    ids = torch.ones(2, 5, dtype=torch.long)
    rmask = t([0, 1, 1, 1, 0], [0, 1, 1, 0, 0])
    return Batch(input_ids=ids, attention_mask=torch.ones(2, 5), response_mask=rmask, old_logprobs=torch.zeros(2, 5),
                 rewards=torch.zeros(2), versions=torch.tensor(versions), token_versions=token_versions, **kw)


def test_batch_validates_token_versions_shape_dtype_and_oldest_version():
    tv = t([7, 3, 3, 4, 0], [7, 3, 3, 0, 0])
    b = batch(tv)
    assert b.spans(0) == [(3, 0, 1), (4, 2, 2)] and b.spans(1) == [(3, 0, 1)]
    assert b.span_counts().tolist() == [2, 1]
    with pytest.raises(BatchError, match=r"token_versions has shape \(2, 4\), expected \(2, 5\)"):
        batch(tv[:, :4])
    with pytest.raises(BatchError, match="token_versions must be long"):
        batch(tv.float())
    with pytest.raises(BatchError, match=r"versions\[0\]=4 is not the oldest"):
        batch(tv, versions=(4, 3))
    # without token_versions every token is the sample's version
    assert batch().spans(1) == [(3, 0, 1)] and batch().versions_per_token()[0].tolist() == [3] * 5
    # select keeps the rows' versions; concat fills a batch without token_versions from its versions
    assert b.select(t(0)).spans(0) == [(3, 0, 1), (4, 2, 2)]
    both = Batch.concat([b, batch(versions=(2, 2))])
    assert both.token_versions[2:, 1:3].tolist() == [[2, 2], [2, 2]] and both.spans(0) == b.spans(0)


def _rollout(token_versions=None):
    ids = torch.ones(2, 5, dtype=torch.long)
    rmask = t([0, 1, 1, 1, 0], [0, 0, 0, 0, 0])
    return Rollout(input_ids=ids, attention_mask=torch.ones(2, 5), response_mask=rmask,
                   logprobs=torch.zeros(2, 5), response_ids=[[1, 1, 1], []], version=6,
                   token_versions=token_versions)


def test_to_batch_fills_token_versions_and_the_oldest_version():
    plain = _rollout().to_batch(torch.zeros(2))
    assert plain.token_versions.tolist() == [[6] * 5] * 2 and plain.versions.tolist() == [6, 6]
    mixed = _rollout(t([6, 5, 5, 6, 6], [6, 6, 6, 6, 6])).to_batch(torch.zeros(2), t(0, 0))
    # sample 0's oldest token is v5; sample 1 has no response token: the rollout's version
    assert mixed.versions.tolist() == [5, 6] and mixed.spans(0) == [(5, 0, 1), (6, 2, 2)]


def test_a_sample_spanning_a_switch_gets_a_trace_event_with_its_spans(tmp_path):
    b = _rollout(t([6, 5, 5, 6, 6], [6, 6, 6, 6, 6])).to_batch(torch.zeros(2), t(11, 11))
    with TraceWriter(tmp_path / "trace.json", t0_ns=0) as tw:
        assert tw.mixed_samples("spot-0", "spot", b) == 1
        assert tw.mixed_samples("spot-0", "spot", _rollout().to_batch(torch.zeros(2))) == 0
    events = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
              if e.get("name") == "mixed_version_sample"]
    assert [e["args"] for e in events] == [{"group": 11, "version": 5, "spans": [[5, 0, 1], [6, 2, 2]]}]
