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
BOS, EOS = 1, 2
MODES = 4
FIRST_CONTENT = 3 + MODES  # ids 0..2 special, 3..6 modes
CONTENT = 256  # content tokens FIRST_CONTENT .. FIRST_CONTENT + CONTENT - 1; the rest unused


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
