"""A rich progress bar on stderr for long sweeps (a no-op when disabled)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["progress_bar"]


@contextmanager
def progress_bar(total: int, *, enabled: bool, label: str = "bench") -> Iterator[Callable[[str], None]]:
    """Yield ``advance(description)``; draws a transient bar on stderr if ``enabled``.

    The bar only draws on a terminal, so redirected output and test logs stay clean.
    """
    if not enabled:
        yield lambda _desc: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True, emoji=False)
    if not console.is_terminal:
        yield lambda _desc: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(label, total=total)

        def advance(desc: str) -> None:
            progress.update(task, advance=1, description=f"{label}: {desc}")

        yield advance
