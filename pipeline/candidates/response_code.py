"""Take the candidate's Python file out of a model response (markdown with code fences).

The verifier's extractor decides what a response's code is, so the pipeline stores exactly the
code the verifier will run; this module only adds the pipeline's notion of "no code at all"
(the verifier hands back unfenced text as is and rejects it later).
"""

from __future__ import annotations

from verifier import pyast
from verifier.checks.extract import extract_code as _verifier_extract


def _bare_python(response: str) -> str | None:
    """A response without fences counts as code only if it is Python defining ModelNew."""
    text = response.strip()
    if "class ModelNew" not in text:
        return None
    try:
        pyast.parse(text)
    except (SyntaxError, ValueError):
        return None
    return text + "\n"


def extract_code(response: str) -> str | None:
    """The Python source in `response`, or None when it holds no code."""
    code = _verifier_extract(response)
    if not code.strip():
        return None
    if code == response and "```" not in response:
        return _bare_python(response)
    return code
