"""docs/integration.md promises a ≤ 20-line integration; run that exact snippet."""
import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "integration.md"


def test_integration_snippet_runs_and_is_short():
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert len(lines) <= 20, len(lines)
    exec(compile(block, str(DOC), "exec"), {"__name__": "integration_doc"})
