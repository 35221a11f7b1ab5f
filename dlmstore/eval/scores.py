"""How an answer is scored against the reference: exact match and token-F1, as SQuAD scores them.

Both compare *normalised* texts: lower case, punctuation removed (Markdown's
backticks and asterisks with it), the articles ``a``, ``an``, ``the``
dropped, whitespace collapsed. Exact match is 1 when the normalised texts
are equal; token-F1 is the harmonic mean of the precision and recall of the
answer's words against the reference's (a bag of words, counted with
multiplicity), 1 when both are empty.

Perplexity is ``exp(loss)`` (DLM's ``dlm.eval.perplexity``): infinite for a
loss that is not finite, or too large to exponentiate.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalise(text: str) -> str:
    """The text exact match and token-F1 compare: lower case, no punctuation or articles, single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(answer: str, reference: str) -> bool:
    """Whether the answer is the reference once both are normalised."""
    return normalise(answer) == normalise(reference)


def token_f1(answer: str, reference: str) -> float:
    """Token-F1 of the answer's normalised words against the reference's."""
    got, want = normalise(answer).split(), normalise(reference).split()
    if not got or not want:
        return float(got == want)
    common = sum((Counter(got) & Counter(want)).values())
    if not common:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


def perplexity(loss: float) -> float:
    """``exp(loss)``; infinite when the loss is not finite, negative, or overflows."""
    if not math.isfinite(loss) or loss < 0.0:
        return math.inf
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf
