"""Text: ONNX's string operators (``StringConcat``, ``StringSplit``, ``RegexFullMatch``, ``StringNormalizer``), and
``TfIdfVectorizer`` on integer token ids (opset 9), what scikit-learn's and Keras's text pipelines export for
bag-of-n-grams features.

Strings are NumPy object arrays of ``str`` computed on the host: a STRING graph input is static (known before
running, one compile per value), the string operators run while the graph is traced, and a string output leaves
the compiled program as the value computed then (:data:`optkit.onnx._base.values.STRING`). ``RegexFullMatch``
matches with Python's ``re`` (ONNX specifies RE2's syntax, which Python's accepts for the common patterns; a
pattern Python rejects is an error naming the node).

Semantics from ONNX's operator page (``TfIdfVectorizer``): the n-grams to count are listed in ``pool_int64s``,
grouped by length (``ngram_counts[i]`` is where the (i+1)-grams start), each with its output column
(``ngram_indexes``); an n-gram of length 2 or more is also counted with up to ``max_skip_count`` tokens skipped
between its items (the same skip throughout), a 1-gram once; ``mode`` ``TF`` gives the counts, ``IDF`` the
``weights`` where a count is positive, ``TFIDF`` the counts times the ``weights``. Checked against ONNX's node
cases (tests/onnx/ops/test_backend.py) and ONNX Runtime (tests/onnx/ops/test_text_and_signal.py). String pools
(``pool_strings``) are refused: optkit runs tensors.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np

from optkit.onnx._base.values import STRING, is_string, string_array
from optkit.onnx._ops._registry import Family

OPS = Family("text")


@OPS.op("TfIdfVectorizer", 9)
def _tfidf_vectorizer(ctx):
    a = ctx.attrs
    if a.get("pool_strings"):
        raise ctx.unsupported("pool_strings: optkit runs integer token ids (pool_int64s), not strings")
    pool = np.asarray(a.get("pool_int64s", []), np.int64)
    counts = [int(c) for c in a.get("ngram_counts", [])]
    indexes = np.asarray(a.get("ngram_indexes", []), np.int64)
    low, high = int(a.get("min_gram_length", 1)), int(a.get("max_gram_length", 1))
    skip = int(a.get("max_skip_count", 0))
    mode = a.get("mode", "TF")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ctx.error(f"mode must be TF, IDF or TFIDF, got {mode!r}")
    if not 1 <= low <= high or len(counts) < high or skip < 0:
        raise ctx.error(f"min_gram_length {low}, max_gram_length {high}, max_skip_count {skip} and ngram_counts "
                        f"{counts} do not fit (1 <= min <= max <= len(ngram_counts), skip >= 0)")
    bounds = [*counts, len(pool)]
    groups = []  # (n, the pool's n-grams as rows), in pool order
    position = 0
    for n in range(1, len(counts) + 1):
        start, stop = bounds[n - 1], bounds[n]
        if stop < start or (stop - start) % n:
            raise ctx.error(f"ngram_counts {counts}: the {n}-grams pool_int64s[{start}:{stop}] is not a whole "
                            f"number of {n}-grams")
        grams = pool[start:stop].reshape(-1, n)
        groups.append((n, grams))
        position += len(grams)
    if len(indexes) != position:
        raise ctx.error(f"ngram_indexes has {len(indexes)} entries for the {position} n-grams of pool_int64s")
    if position and indexes.min() < 0:
        raise ctx.error("ngram_indexes must be non-negative")
    columns = int(indexes.max()) + 1 if position else 0
    weights = np.asarray(a.get("weights", np.ones(position)), np.float32)
    if len(weights) != position:
        raise ctx.error(f"weights has {len(weights)} entries for the {position} n-grams")
    scatter = np.zeros((position, columns), np.float32)
    scatter[np.arange(position), indexes] = 1.0  # n-gram j -> its output column

    def tfidf_vectorizer(x):
        x = jnp.asarray(x)
        if x.ndim not in (1, 2) or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ctx.error(f"X must be 1-D or 2-D integer token ids, got {x.dtype}{list(x.shape)}")
        length = x.shape[-1]

        def zeros(count):  # (N..., count) zeros laid out as x's rows are (sharded with them on a mesh)
            return jnp.repeat(jnp.zeros_like(x[..., :1], dtype=jnp.float32), count, axis=-1)

        parts = []  # each pool group's counts, in pool order
        for n, grams in groups:
            total = zeros(len(grams))
            for s in range(skip + 1 if n > 1 else 1) if low <= n <= high and len(grams) else ():
                step = s + 1
                windows = length - (n - 1) * step
                if windows <= 0:
                    break
                hit = None
                for k in range(n):
                    same = x[..., k * step:k * step + windows, None] == jnp.asarray(grams[:, k], x.dtype)
                    hit = same if hit is None else hit & same
                total = total + jnp.sum(hit, axis=-2, dtype=jnp.float32)
            parts.append(total)
        found = jnp.concatenate(parts, axis=-1) if parts else zeros(0)
        if mode == "IDF":
            found = (found > 0).astype(jnp.float32) * weights
        elif mode == "TFIDF":
            found = found * weights
        return found @ jnp.asarray(scatter)

    return tfidf_vectorizer


def _strings(ctx, value, what: str) -> np.ndarray:
    if not is_string(value):
        raise ctx.error(f"{what} must be a string tensor, got {getattr(value, 'dtype', type(value).__name__)}")
    return value


@OPS.op("StringConcat", 20, static_inputs=(0, 1))
def _string_concat(ctx):
    def string_concat(x, y):
        a, b = np.broadcast_arrays(_strings(ctx, x, "X"), _strings(ctx, y, "Y"))
        return string_array((p + q for p, q in zip(a.ravel().tolist(), b.ravel().tolist())), a.shape)

    return string_concat


@OPS.op("RegexFullMatch", 20, static_inputs=(0,))
def _regex_full_match(ctx):
    pattern = ctx.attrs.get("pattern")
    if pattern is None:
        raise ctx.error("the attribute 'pattern' is required")
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        raise ctx.error(f"pattern {pattern!r} is not a regular expression Python's re accepts: {err}") from None

    def regex_full_match(x):
        x = _strings(ctx, x, "X")
        return np.array([compiled.fullmatch(v) is not None for v in x.ravel().tolist()], bool).reshape(x.shape)

    return regex_full_match


@OPS.op("StringSplit", 20, static_inputs=(0,))
def _string_split(ctx):
    delimiter = ctx.attrs.get("delimiter") or None  # empty or absent: runs of whitespace, as str.split()
    maxsplit = ctx.attrs.get("maxsplit")
    limit = -1 if maxsplit is None else int(maxsplit)

    def string_split(x):
        x = _strings(ctx, x, "X")
        parts = [v.split(delimiter, limit) if v or delimiter is not None else [] for v in x.ravel().tolist()]
        width = max((len(p) for p in parts), default=0)
        ctx.check_size((x.size, width), STRING, "output 'Y'")
        y = string_array((q for p in parts for q in p + [""] * (width - len(p))), (*x.shape, width))
        return y, np.array([len(p) for p in parts], np.int64).reshape(x.shape)

    return string_split


@OPS.op("StringNormalizer", 10, static_inputs=(0,))
def _string_normalizer(ctx):
    action = ctx.attrs.get("case_change_action", "NONE")
    if action not in ("NONE", "LOWER", "UPPER"):
        raise ctx.error(f"case_change_action must be NONE, LOWER or UPPER, got {action!r}")
    sensitive = bool(ctx.attrs.get("is_case_sensitive", 0))
    stopwords = set(ctx.attrs.get("stopwords") or ())
    if not sensitive:
        stopwords = {w.lower() for w in stopwords}
    change = {"NONE": str, "LOWER": str.lower, "UPPER": str.upper}[action]

    def string_normalizer(x):
        x = _strings(ctx, x, "X")
        if x.ndim not in (1, 2) or x.ndim == 2 and x.shape[0] != 1:
            raise ctx.error(f"X must be [C] or [1, C], got shape {list(x.shape)}")
        kept = [change(v) for v in x.ravel().tolist() if (v if sensitive else v.lower()) not in stopwords]
        kept = kept or [""]  # (every string removed: one empty string, as ONNX specifies)
        return string_array(kept, (len(kept),) if x.ndim == 1 else (1, len(kept)))

    return string_normalizer
