"""The exceptions the CLI prints as one line, no traceback: each has its own exit status."""

import contextlib
from typing import Iterator


class UserError(ValueError):
    """Bad input the user can fix; the message names the file, model, tensor or field."""


class MeasurementError(RuntimeError):
    """A built-in precheck diagnostic could not measure: the precheck fails closed (exit 3)."""


def not_yaml(path, error: Exception) -> UserError:
    """A file that does not parse as YAML, as one line: where the parser stopped and what it met."""
    mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = problem or (str(error).splitlines()[0] if str(error) else type(error).__name__)
    context = getattr(error, "context", None)
    return UserError(f"{path}: not valid YAML{where} ({what}{', ' + context if context else ''})")


@contextlib.contextmanager
def reading(path, kind: str) -> Iterator[None]:
    """While a user's file is read by a library (pyarrow, csv, datasets, json): a file that breaks
    it (not a ``kind`` at all, cut off, not UTF-8) is one line naming the file and what is wrong."""
    try:
        yield
    except UserError:
        raise
    except Exception as error:  # the reader's own words, first line, are what the user can act on
        said = (str(error).splitlines() or [type(error).__name__])[0].replace(str(path), "the file")
        said = said if len(said) <= 160 else said[:159] + "…"
        raise UserError(f"probe {path}: not a readable {kind} ({said})") from None
