"""The types of the C module built from _figures.c (mypy reads this; nothing imports it)."""

from collections.abc import Callable, Sequence

from loadertop.client.document import Stats

def stats_of_parts(parts: list[Sequence[int]], /) -> Stats | None: ...
def bind(stats: type[Stats], python: Callable[[list[Sequence[int]]], Stats | None], /) -> None: ...
