"""Text features on integer token ids: ONNX's ``TfIdfVectorizer`` (opset 9), what scikit-learn's and Keras's text
pipelines export for bag-of-n-grams features.

Semantics from ONNX's operator page (``TfIdfVectorizer``): the n-grams to count are listed in ``pool_int64s``,
grouped by length (``ngram_counts[i]`` is where the (i+1)-grams start), each with its output column
(``ngram_indexes``); an n-gram of length 2 or more is also counted with up to ``max_skip_count`` tokens skipped
between its items (the same skip throughout), a 1-gram once; ``mode`` ``TF`` gives the counts, ``IDF`` the
``weights`` where a count is positive, ``TFIDF`` the counts times the ``weights``. Checked against ONNX's node
cases (tests/onnx/test_backend.py) and ONNX Runtime (tests/onnx/test_ops.py). String pools (``pool_strings``) are
refused: optkit runs tensors.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

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
    groups = []  # (n, the pool's n-grams as rows, their positions in ngram_indexes)
    position = 0
    for n in range(1, len(counts) + 1):
        start, stop = bounds[n - 1], bounds[n]
        if stop < start or (stop - start) % n:
            raise ctx.error(f"ngram_counts {counts}: the {n}-grams pool_int64s[{start}:{stop}] is not a whole "
                            f"number of {n}-grams")
        grams = pool[start:stop].reshape(-1, n)
        groups.append((n, grams, np.arange(position, position + len(grams))))
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
        found = jnp.zeros((*x.shape[:-1], position), jnp.float32)
        for n, grams, where in groups:
            if not low <= n <= high or not len(grams):
                continue
            total = 0
            for s in range(skip + 1 if n > 1 else 1):
                step = s + 1
                span = (n - 1) * step
                if span >= length:
                    break
                windows = length - span
                hit = jnp.ones((*x.shape[:-1], windows, len(grams)), bool)
                for k in range(n):
                    item = x[..., k * step:k * step + windows, None]
                    hit = hit & (item == jnp.asarray(grams[:, k], x.dtype))
                total = total + jnp.sum(hit, axis=-2, dtype=jnp.float32)
            found = found.at[..., where].set(total)
        if mode == "IDF":
            found = (found > 0).astype(jnp.float32) * weights
        elif mode == "TFIDF":
            found = found * weights
        return found @ jnp.asarray(scatter)

    return tfidf_vectorizer
