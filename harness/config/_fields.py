"""The pieces every config model is built of: strict models, and text that YAML must not reinterpret."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

__all__ = ["Id", "Strict", "Text", "check_globs"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _integer_as_text(value: Any) -> Any:
    """YAML reads `id: 7` as a number; an id means its text. Only a plain integer is taken: YAML also
    reads `3.10` as 3.1, `022` as 18 and `12:30` as 750, and `true`/`yes`/`on` alike as True."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _quote_it(value)


def _quote_it(value: Any) -> Any:
    """Text only: a YAML number or boolean here would be rewritten (`3.10` -> 3.1, `022` -> 18)."""
    if isinstance(value, bool | int | float):
        raise ValueError(f"YAML read this as {type(value).__name__} {value!r}: quote it to keep the text")
    return value


#: An id: text, or a YAML integer taken as its decimal text.
Id = Annotated[str, BeforeValidator(_integer_as_text)]
#: Text that must be written as text (environment values): numbers are refused with the way out.
Text = Annotated[str, BeforeValidator(_quote_it)]


def check_globs(patterns: list[str]) -> list[str]:
    """Worktree globs are relative and normalised: anything else could never match, silently."""
    for pattern in patterns:
        if pattern.startswith("/"):
            raise ValueError(f"{pattern!r}: paths are relative to the worktree, not absolute")
        if pattern.startswith("./") or "/./" in pattern or pattern in (".", ""):
            raise ValueError(f"{pattern!r}: write it without './'")
        if ".." in pattern.split("/"):
            raise ValueError(f"{pattern!r}: '..' never matches (paths are resolved first)")
        if pattern.endswith("/"):
            raise ValueError(f"{pattern!r}: a directory's contents are '{pattern}**'")
    return patterns
