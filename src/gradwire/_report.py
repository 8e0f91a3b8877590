"""``gradwire.report``: a script's own metrics, for ``gradwire compare -- CMD``.

A script calls ``gradwire.report(step=step, loss=val_loss, accuracy=acc)``
wherever it computes a metric. Under ``gradwire compare`` the values go into
the comparison's table (the last value of each metric, mean and spread over
seeds) and its metric-over-time plot; anywhere else the call returns at once
and reads nothing (a GPU tensor passed in is not synchronised).
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["report"]

#: set by the compare child in a rank of ``gradwire compare``: ``sink(step, {name: value})``
_sink: Callable[[int | None, dict[str, float]], None] | None = None


def report(step: int | None = None, **metrics: Any) -> None:
    """Record the script's metrics (loss, accuracy, ...) under ``gradwire compare``; a no-op elsewhere.

    Args:
        step: the training step the values belong to (default: the optimizer
            steps taken so far).
        metrics: ``name=value``; numbers, or one-element tensors.

    Raises:
        TypeError: under ``gradwire compare``, a value that is not a number
            (outside it nothing is checked).

    Example::

        import gradwire
        ...
        if step % 50 == 0:
            gradwire.report(step=step, val_loss=evaluate(model))
    """
    if _sink is None:
        return
    values: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            values[name] = float(value.detach() if hasattr(value, "detach") else value)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"gradwire.report: {name}={value!r:.80} is not a number; report floats, ints or "
                            "one-element tensors") from None
    if step is not None and not isinstance(step, int):
        raise TypeError(f"gradwire.report: step must be an int, got {step!r:.80}")
    _sink(step, values)
