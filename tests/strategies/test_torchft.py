"""``torchft-diloco``: torchft's own DiLoCo, its Manager's all_reduces on gradwire groups (the simulated network)."""
from __future__ import annotations

import pytest

from gradwire.launch import spawn
from gradwire.strategies import parse_strategy
from gradwire.strategies.base import CannotApply

from tests.compare import inject_ranks


def test_names_options_and_refusals() -> None:
    assert parse_strategy("torchft-diloco:100:lr=0.7:mu=0.9").average_schedule() == (100, 1, False)
    assert parse_strategy("torchft-diloco:100:bucket").build().bucket  # type: ignore[attr-defined]
    assert not parse_strategy("torchft-diloco:100").build().bucket  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="its own Manager"):
        parse_strategy("int8+torchft-diloco:100")
    with pytest.raises(ValueError, match="outer momentum"):
        parse_strategy("torchft-diloco:10:mu=1").build()


def test_without_torchft_it_is_refused_with_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradwire.strategies import torchft_diloco

    monkeypatch.setattr(torchft_diloco, "torchft_version", lambda: None)
    strategy = parse_strategy("torchft-diloco:4").build()
    with pytest.raises(CannotApply, match="pip install torchft"):
        strategy.attach_ddp(None)  # type: ignore[arg-type]  # refused before it looks at the DDP


@pytest.mark.slow
def test_torchft_diloco_runs_its_rounds_on_gradwire_groups_and_the_ranks_meet() -> None:
    pytest.importorskip("torchft", reason="torchft is in the test extra; without it the strategy is refused")
    # 8 AdamW steps, H=4: two rounds of torchft's quorum and per-tensor all_reduces, on groups the gradwire
    # backend made (their ops are in the network's log), and every rank ends on the round's model
    res = spawn(inject_ranks.torchft_rounds, 2, ("torchft-diloco:4", 8), timeout=110)
    for r in res:
        assert r["status"] == "applied", (r["reason"], r.get("raised"))
        assert r["same"], "after the last round every rank holds the same model"
        assert "torchft" in r["description"] and "DiLoCo" in r["description"]
        assert r["torchft_ops"] >= 2 * 4  # two rounds, one all_reduce per parameter tensor (4 of them)
        # fp32 outer gradients of the Net's 4 tensors (32*64 + 64 + 64*32 + 32), once per round
        assert r["torchft_bytes"] >= 2 * 4 * (32 * 64 + 64 + 64 * 32 + 32)


@pytest.mark.slow
@pytest.mark.parametrize("leaver", [0, 1], ids=["the lighthouse's rank leaves", "another rank leaves"])
def test_torchft_diloco_a_rank_that_leaves_fails_the_others_within_the_groups_timeout(leaver: int) -> None:
    pytest.importorskip("torchft", reason="torchft is in the test extra; without it the strategy is refused")
    # H=4, 12 steps; one rank ends after step 5 (inside the second round): the other's next quorum waits for it,
    # then raises (the group's timeout, 10 s here); it never trains on alone or hangs
    res = spawn(inject_ranks.torchft_rank_leaves, 2, ("torchft-diloco:4", 12, leaver, 5), timeout=100)
    survivor = res[1 - leaver]
    assert res[leaver] == {"left": True}
    assert survivor["raised"] is not None, "the survivor trained to the end without its peer"
    assert survivor["raised"].startswith("TimeoutError: torchft-diloco: the quorum of round 2 (at step 8)")
    assert "a rank left the training" in survivor["raised"]
    assert survivor["seconds"] < 60, survivor
