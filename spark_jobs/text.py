"""Small helpers for what users read: counts with the right plural form.

One place, so that every message -- ``show``, the verbs' summaries, the operators' log lines --
says "1 file group" and "2 file groups" alike.
"""

from __future__ import annotations

__all__ = ["plural"]


def plural(n: int | float, noun: str, plural_form: str | None = None) -> str:
    """``"1 file group"``, ``"3 file groups"``, ``"0 rows"``: ``n`` and ``noun`` in the form ``n`` takes.

    The last word is inflected by the English rules messages need (``entry`` -> ``entries``,
    ``index`` -> ``indexes``, ``bucket`` -> ``buckets``); ``plural_form`` for any other noun.
    """
    if n == 1:
        return f"{n} {noun}"
    if plural_form is None:
        head, _, last = noun.rpartition(" ")
        if last.endswith(("s", "x", "sh", "ch")):
            last += "es"
        elif last.endswith("y") and last[-2:-1] not in ("a", "e", "i", "o", "u"):
            last = last[:-1] + "ies"
        else:
            last += "s"
        plural_form = f"{head} {last}" if head else last
    return f"{n} {plural_form}"
