"""The formulas of optkit's docstrings, typeset as math on the documentation site.

Docstrings write each algorithm's formulas as plain text in a literal block
(``X_new = X - r * G_reg / (sqrt(H_new) + epsilon)``), which reads well in
``help()`` and beside the SPEC. :func:`process_docstring` (an
``autodoc-process-docstring`` handler) turns such a block into a ``math``
directive for the HTML pages; :func:`to_latex` is the translation of one line.
A block is taken for formulas only when every line is one (an assignment, a
mode prefix such as ``standard:``, a trailing ``#`` comment); anything else
(code, doctests) stays as it is.
"""

from __future__ import annotations

import re

GREEK = {"alpha", "beta", "rho", "epsilon", "eps", "gamma", "lambda"}
FUNCTIONS = {"max": r"\max", "min": r"\min", "sqrt": None, "RMS": r"\operatorname{RMS}", "exp": r"\exp",
             "mean": r"\operatorname{mean}", "mean_i": r"\operatorname{mean}_i", "mean_j": r"\operatorname{mean}_j",
             "rsqrt": r"\operatorname{rsqrt}", "log": r"\log"}
_TOKEN = re.compile(r"\s+|[A-Za-z][A-Za-z0-9]*(?:_(?:\{[^}]*\}|[A-Za-z0-9]+))*|\d+(?:\.\d+)?(?:e-?\d+)?|\S")
_FORMULA_LINE = re.compile(r"^(?:[a-z]+:\s+)?[A-Za-z][\w{}\-]*\s*=[^=].*$")
_CODE = re.compile(r">>>|\bimport\b|\bdef\b|\blambda\b|\breturn\b|\bfor\b|\[|\]|\"|'")


def _identifier(token: str) -> str:
    """An identifier in LaTeX: ``G_reg`` -> ``G_{\\mathrm{reg}}``, ``b2_t`` -> ``b_{2,t}``, ``X_{t-1}`` as it is,
    ``decay_factor`` -> ``\\mathrm{decay\\_factor}``, ``alpha`` -> ``\\alpha``."""
    numbered = re.fullmatch(r"([A-Za-z]+?)(\d+)(?:_(\w+))?", token)
    if numbered:  # b1, eps1, b2_t: a symbol with a number, and maybe a step, as subscripts
        head, digit, step = numbered.groups()
        head = "\\" + ("epsilon" if head == "eps" else head) if head in GREEK else head
        return f"{head}_{{{digit}{',' + step if step else ''}}}"
    base, _, sub = token.partition("_")
    if base in GREEK and not sub:
        return "\\" + ("epsilon" if base == "eps" else base)
    if sub and (len(base) == 1 or base in GREEK):
        head = "\\" + ("epsilon" if base == "eps" else base) if base in GREEK else base
        if sub.startswith("{") and sub.endswith("}"):
            return f"{head}_{{{sub[1:-1]}}}"
        subs = sub.split("_")
        if len(subs) == 1 and len(subs[0]) <= 2:
            return f"{head}_{{{subs[0]}}}"
        joined = "\\_".join(subs)
        return head + "_{\\mathrm{" + joined + "}}"
    if len(token) == 1:
        return token
    return r"\mathrm{" + token.replace("_", r"\_") + "}"


def _closing(tokens: list[str], start: int) -> int:
    """The index of the ")" that closes the "(" at ``tokens[start]`` (or the end)."""
    depth, j = 0, start
    while j < len(tokens):
        depth += {"(": 1, ")": -1}.get(tokens[j], 0)
        if depth == 0:
            break
        j += 1
    return j


def _expression(text: str) -> str:
    """One expression (no comment): identifiers, numbers, operators, ``sqrt(...)`` and ``^(...)``."""
    tokens = [t for t in _TOKEN.findall(text)]
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.isspace():
            out.append(" ")
        elif token in FUNCTIONS and i + 1 < len(tokens) and tokens[i + 1] == "(":
            j = _closing(tokens, i + 1)
            inner = _expression("".join(tokens[i + 2:j]))
            out.append(rf"\sqrt{{{inner}}}" if token == "sqrt" else rf"{FUNCTIONS[token]}\left({inner}\right)")
            i = j
        elif token == "^" and i + 1 < len(tokens):
            if tokens[i + 1] == "(":
                j = _closing(tokens, i + 1)
                out.append("^{" + _expression("".join(tokens[i + 2:j])) + "}")
                i = j
            else:
                out.append("^{" + _expression(tokens[i + 1]) + "}")
                i += 1
        elif token == "*":
            out.append(r" \cdot ")
        elif token == "@":
            out.append(" ")
        elif token in ("if", "else"):
            out.append(rf"\ \text{{{token}}}\ ")
        elif token == ">=":
            out.append(r"\ge")
        elif token[0].isalpha():
            out.append(_identifier(token))
        elif re.fullmatch(r"\d+(?:\.\d+)?e-?\d+", token):
            mantissa, exponent = token.split("e")
            out.append(("" if mantissa == "1" else mantissa + r" \cdot ") + "10^{" + str(int(exponent)) + "}")
        else:
            out.append({"{": r"\{", "}": r"\}", "%": r"\%", "#": r"\#"}.get(token, token))
        i += 1
    return re.sub(r" +", " ", "".join(out)).strip()


def to_latex(line: str) -> str:
    """One formula line as a LaTeX row of an ``aligned`` environment (``lhs &= rhs``)."""
    line, _, comment = line.partition("#")
    mode = re.match(r"^\s*([a-z]+):\s+", line)
    prefix = ""
    if mode:
        prefix = rf"\text{{{mode.group(1)}:}}\ "
        line = line[mode.end():]
    lhs, _, rhs = line.partition("=")
    row = f"{prefix}{_expression(lhs)} &= {_expression(rhs)}"
    comment = comment.strip()
    if comment:
        words, colon, formula = comment.partition(":")
        if not colon and re.search(r"[=_^+*/]", comment):
            words, formula = "", comment
        elif not re.search(r"[=_^+*/]", formula):
            words, formula = comment, ""
        words = re.sub(r"[^\w ,.;:()'-]", "", words).strip()
        note = (rf"\text{{{words}{':' if colon and formula else ''}}}\ " if words else "") + (
            _expression(formula) if formula else "")
        # A long note goes under its formula, not beside it.
        row += rf" \qquad {note}" if len(comment) <= 24 else rf" \\ & \qquad {note}"
    return row


def is_formula_block(lines: list[str]) -> bool:
    body = [line for line in lines if line.strip()]
    return bool(body) and all(_FORMULA_LINE.match(line.strip()) and not _CODE.search(line) for line in body)


def process_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    """Replace each literal block of formulas (after a line ending in ``::``) with a ``math`` directive."""
    i = 0
    while i < len(lines):
        if not lines[i].rstrip().endswith("::") or lines[i].strip().startswith(".."):
            i += 1
            continue
        indent = len(lines[i]) - len(lines[i].lstrip())
        start = i + 1
        while start < len(lines) and not lines[start].strip():
            start += 1
        end = start
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
            end += 1
        while end > start and not lines[end - 1].strip():
            end -= 1
        block = lines[start:end]
        if end > start and is_formula_block(block):
            lines[i] = lines[i].rstrip()[:-1]  # "text::" reads "text:" (reST), before the math instead of code
            pad = " " * indent
            rows = [to_latex(line.strip()) for line in block if line.strip()]
            math = [f"{pad}.. math::", "", f"{pad}   \\begin{{aligned}}"]
            math += [f"{pad}   {row} \\\\" for row in rows[:-1]] + [f"{pad}   {rows[-1]}", f"{pad}   \\end{{aligned}}"]
            lines[i + 1:end] = [""] + math
            i += len(math) + 2
        else:
            i = end
