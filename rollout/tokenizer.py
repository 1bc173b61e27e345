"""`CharTokenizer`: one token per symbol, for the synthetic tasks' tiny models (no files, no downloads).

    tok = CharTokenizer("abc")      # ids: <pad>=0 <bos>=1 <eos>=2 <sep>=3 a=4 b=5 c=6
    tok.encode("cab") == [6, 4, 5]; tok.decode([6, 4, 2]) == "ca"   (decode stops at <eos>)

Simplifies: the subset of a HF tokenizer's interface the rollout engine and tasks use
(`encode`, `decode`, the special ids, `vocab_size`).
"""

from __future__ import annotations

SPECIALS = ("<pad>", "<bos>", "<eos>", "<sep>")


class UnknownSymbolError(ValueError):
    """Text holds a character outside the tokenizer's alphabet."""


class CharTokenizer:
    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    sep_token_id = 3

    def __init__(self, symbols: str):
        if len(set(symbols)) != len(symbols):
            raise ValueError(f"symbols must be distinct, got {symbols!r}")
        self.symbols = symbols
        self._id = {s: i + len(SPECIALS) for i, s in enumerate(symbols)}

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.symbols)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._id[ch] for ch in text]
        except KeyError as e:
            raise UnknownSymbolError(f"{e.args[0]!r} is not one of {self.symbols!r}") from None

    def decode(self, ids: list[int]) -> str:
        out = []
        for i in ids:
            if i == self.eos_token_id:
                break
            if i >= len(SPECIALS):
                out.append(self.symbols[i - len(SPECIALS)])
        return "".join(out)
