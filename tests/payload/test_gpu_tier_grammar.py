"""The GPU tier's constrained requests against the line's own grammar path, on CPU.

The tiny models carry a word-level tokenizer (``gpu/language.py`` ``save_tokenizer``) so that
the servers run the xgrammar backend; the tier's constrained requests ask for
``GRAMMAR_REGEX`` and its check reads their outputs with ``grammar_allows``. Here the line's
``get_tokenizer`` loads that tokenizer and the line's ``XGrammarGrammarBackend`` (over the
bundle's xgrammar) compiles the expression against it: the mask it fills at each step admits
exactly the tokens ``grammar_allows`` names (and the end of sequence once one was accepted),
and a token outside them is refused. The GPU cannot run here; what its check assumes must
hold of the code it runs on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from spec_fixtures import spec_tree

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))

from language import (  # noqa: E402
    EOS,
    GRAMMAR_REGEX,
    VOCAB,
    ChainLanguage,
    grammar_allows,
    save_tokenizer,
    token_text,
)

LINE = "0.5.17"
pytestmark = [pytest.mark.payload, pytest.mark.of_the_line, pytest.mark.sglang_lines(LINE)]


@pytest.fixture(scope="module")
def tree(request):
    return spec_tree(request, os.environ.get("PATCHKIT_PAYLOAD_LINE") or LINE)


def _admitted(grammar, mask) -> set[int]:
    grammar.fill_vocab_mask(mask, 0)
    words = [w & 0xFFFFFFFF for w in mask[0].tolist()]
    return {32 * i + j for i, w in enumerate(words) for j in range(32) if w >> j & 1} & set(
        range(VOCAB)
    )


def test_the_tiny_tokenizer_compiles_the_tiers_grammar(tree, tmp_path):
    import xgrammar
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    save_tokenizer(tmp_path)
    tokenizer = get_tokenizer(str(tmp_path))
    assert tokenizer.convert_ids_to_tokens(list(range(VOCAB))) == [
        token_text(i) for i in range(VOCAB)
    ]
    assert tokenizer.eos_token_id == EOS
    backend = XGrammarGrammarBackend(tokenizer, vocab_size=VOCAB, model_eos_token_ids=[EOS])
    grammar = backend.dispatch_regex(GRAMMAR_REGEX)
    mask = xgrammar.allocate_token_bitmask(1, VOCAB)
    allowed = {t for t in range(VOCAB) if grammar_allows(t)}
    assert len(allowed) == 128 and _admitted(grammar, mask) == allowed
    # the language's own continuation leaves the grammar within a few tokens
    lang = ChainLanguage.make(0)
    chain = lang.continue_(lang.prompt(0, 6), 16)
    assert not all(map(grammar_allows, chain))
    for token in sorted(allowed)[::17]:
        grammar.accept_token(token)
        assert _admitted(grammar, mask) == allowed | {EOS}
    refused = next(t for t in chain if not grammar_allows(t))
    with pytest.raises(ValueError, match="not accepted"):
        grammar.accept_token(refused)
