"""AdamW that clips by norm under a compressed exchange with error feedback: LocalMomentsAdam (2 ranks)."""
from __future__ import annotations

import pytest
import torch

from gradwire.launch import spawn

from . import inject_ranks

pytestmark = pytest.mark.slow

#: 1-bit-class and sparsifying exchanges with error feedback; int8 (unbiased) keeps the released exchange
STRATEGIES = ["onebit", "onebit:allgather:block=64", "topk:0.05", "delayed", "onebit+delayed", "int8"]


@pytest.fixture(scope="module")
def runs() -> dict[str, list[dict]]:
    results = spawn(inject_ranks.clip_cases, 2, (STRATEGIES, True), timeout=120)
    return {s: [results[r][i] for r in range(2)] for i, s in enumerate(STRATEGIES)}


@pytest.mark.parametrize("strategy", STRATEGIES[:5])
def test_clipped_adam_runs_on_rank_moments_and_the_replicas_stay_identical(runs, strategy):
    """Sync with a compressor: identical replicas. Delayed: the ranks differ by their latest own directions."""
    ranks = runs[strategy]
    delayed = "delayed" in strategy
    for run in ranks:
        assert run["status"] == "applied" and "raised" not in run, run
        assert "each rank's own moments of its clipped gradient" in run["description"], run["description"]
        assert ("applied a step late" in run["description"]) == delayed
        assert all(rec["same"] for rec in run["records"]) != delayed, f"{strategy}: {[r['same'] for r in run['records']]}"
    steps = list(zip(*(run["records"] for run in ranks)))
    for t, recs in enumerate(steps):
        exact_norm = recs[0]["exact_norm"]
        assert exact_norm > 2 * inject_ranks.CLIP_NORM  # the clip is active
        for rec in recs:
            # the norm the script logs and clips by is the average gradient's (estimated), the same on every rank
            assert rec["clip_norm"] == pytest.approx(recs[0]["clip_norm"], rel=1e-6)
            assert rec["clip_norm"] == pytest.approx(exact_norm, rel=0.25), (strategy, t)
            assert rec["logged"] == pytest.approx(rec["clip_norm"], rel=1e-6)
            # .grad holds this rank's own gradient (the exchange runs in the step), which the clip scales by
            # torch's factor for that norm: the ranks' clipped gradients average to the clipped average
            torch.testing.assert_close(rec["read"], rec["own"], rtol=1e-5, atol=1e-7)
            factor = min(1.0, inject_ranks.CLIP_NORM / (rec["clip_norm"] + 1e-6))
            torch.testing.assert_close(rec["after_clip"], rec["read"] * factor, rtol=1e-5, atol=1e-8)


def test_under_delayed_the_first_steps_average_is_held_not_sent_and_dropped(runs):
    """The clip hands delayed's step to LocalMomentsAdam at the first step: the average delayed's hook would have
    launched for it (uncompressed, the exchange's warm-up) is never sent, so the run moves no more bytes on the
    exchange's group than the same compressor without delay (whose last step is not in flight at the end)."""
    for delayed_run, plain_run in zip(runs["onebit+delayed"], runs["onebit"]):
        late = [rec["exchanged"] for rec in delayed_run["records"]]
        now = [rec["exchanged"] for rec in plain_run["records"]]
        assert 0 < sum(late) <= sum(now), (late, now)
