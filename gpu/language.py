"""The synthetic language the GPU tier's tiny models speak (stdlib only: tests and bench import it).

A sequence starts with one of ``MODES`` mode tokens; every later token is the image of the
previous one under the mode's fixed random permutation of the ``CONTENT`` content tokens
(few enough that a tiny model learns every mapping with a wide margin in seconds). The next token
therefore depends on the newest token and on the first one (however far back), so greedy
decoding of a well-trained model has one clear answer per step, and a KV or position error
anywhere in the context changes the output.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

VOCAB = 1024
UNK, BOS, EOS = 0, 1, 2
MODES = 4
FIRST_CONTENT = 3 + MODES  # ids 0..2 special, 3..6 modes
CONTENT = 256  # content tokens FIRST_CONTENT .. FIRST_CONTENT + CONTENT - 1; the rest unused
# a content token's text: two letters of 16 (16 x 16 = CONTENT), so a regular expression over
# the text picks content tokens; the grammar-constrained requests of the GPU tier allow those
# whose first letter is one of the first 8 (half of them), so the grammar changes what the model
# would say about every other token and rejects drafts the draft model makes without it
LETTERS = "abcdefghijklmnop"
GRAMMAR_REGEX = "([a-h][a-p])+"
SPECIAL_TEXT = ("<unk>", "<s>", "</s>")


@dataclass(frozen=True)
class ChainLanguage:
    seed: int
    perms: tuple[tuple[int, ...], ...]  # perms[m][x - FIRST_CONTENT] = next token

    @classmethod
    def make(cls, seed: int = 0) -> ChainLanguage:
        rng = random.Random(seed)
        content = list(range(FIRST_CONTENT, FIRST_CONTENT + CONTENT))
        perms = []
        for _ in range(MODES):
            image = content[:]
            rng.shuffle(image)
            perms.append(tuple(image))
        return cls(seed, tuple(perms))

    @classmethod
    def load(cls, path: Path) -> ChainLanguage:
        data = json.loads(Path(path).read_text())
        return cls(int(data["seed"]), tuple(tuple(p) for p in data["perms"]))

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"seed": self.seed, "perms": self.perms}))

    def next_token(self, mode_token: int, token: int) -> int:
        return self.perms[mode_token - 3][token - FIRST_CONTENT]

    def continue_(self, prefix: list[int], n: int) -> list[int]:
        """The ``n`` tokens that follow ``prefix`` (which starts with a mode token)."""
        out, last = [], prefix[-1]
        for _ in range(n):
            last = self.next_token(prefix[0], last)
            out.append(last)
        return out

    def prompt(self, index: int, length: int) -> list[int]:
        """A deterministic in-language prompt: mode token, a start token, its chain."""
        rng = random.Random(self.seed * 1_000_003 + index)
        mode = 3 + rng.randrange(MODES)
        start = rng.randrange(FIRST_CONTENT, FIRST_CONTENT + CONTENT)
        return [mode, start] + self.continue_([mode, start], length - 2)


def token_text(token: int) -> str:
    """The text of a token in the tiny models' tokenizer (``save_tokenizer``)."""
    if token < len(SPECIAL_TEXT):
        return SPECIAL_TEXT[token]
    if token < FIRST_CONTENT:
        return f"<m{token - len(SPECIAL_TEXT)}>"
    if token < FIRST_CONTENT + CONTENT:
        c = token - FIRST_CONTENT
        return LETTERS[c // len(LETTERS)] + LETTERS[c % len(LETTERS)]
    return f"<u{token}>"


def grammar_allows(token: int) -> bool:
    """Whether GRAMMAR_REGEX lets a constrained request emit ``token``."""
    text = token_text(token)
    return FIRST_CONTENT <= token < FIRST_CONTENT + CONTENT and text[0] <= "h"


def save_tokenizer(folder: Path) -> None:
    """A word-level Hugging Face tokenizer of the VOCAB tokens (``tokenizer.json``, with its
    ``tokenizer_config.json``), so that a server loads a tokenizer and its grammar backend
    compiles GRAMMAR_REGEX against the token texts; requests still carry token ids."""
    special = [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, text in enumerate(SPECIAL_TEXT)
    ]  # fmt: skip
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "unk_token": SPECIAL_TEXT[UNK],
                  "vocab": {token_text(i): i for i in range(VOCAB)}},
    }  # fmt: skip
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
        "unk_token": SPECIAL_TEXT[UNK], "bos_token": SPECIAL_TEXT[BOS],
        "eos_token": SPECIAL_TEXT[EOS], "pad_token": SPECIAL_TEXT[UNK],
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
