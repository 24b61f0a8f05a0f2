"""The zoo's judge: the checks of zoo_harness fail on the outcomes they exist to catch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from zoo_harness import Expect, Run, ZooModel, ZooResult, check, ort_parameter_share, perturb_by_one_ulp

from lightning_ort.report import ORTModuleReport

EAGER = [2.0, 1.9, 1.8, 1.7, 1.6]


def result(expect: Expect, share: float, ort_losses: list[float], ulp_losses: list[float] | None = None) -> ZooResult:
    reports = [ORTModuleReport("forward", ort_calls=5 if share else 0, fallback_reason=None if share else "no")]
    if 0 < share < 1:
        reports.append(ORTModuleReport("network.head", fallback_reason="a reason"))
    model = ZooModel("fake/model", nn.Identity, lambda g: None, lambda m, b: torch.zeros(()), expect)
    runs = {
        "eager": Run("eager", EAGER),
        "ulp": Run("ulp", ulp_losses or EAGER),
        "ort": Run("ort", ort_losses, reports=reports, ort_share=share, ort_modules=["forward"] if share else []),
    }
    return ZooResult(model, runs, parameters=100)


def test_a_row_at_its_expectation_and_at_parity_passes() -> None:
    check(result(Expect("all"), 1.0, [2.0, 1.9, 1.8 + 1e-6, 1.7, 1.6]))
    check(result(Expect("partly", 0.5, reason="a reason"), 0.6, EAGER))
    check(result(Expect("none", reason="no"), 0.0, EAGER))


@pytest.mark.parametrize(
    ("expect", "share", "message"),
    [
        (Expect("all"), 0.0, "regressed"),
        (Expect("all"), 0.6, "regressed"),
        (Expect("partly", 0.9, reason="a reason"), 0.6, "share below 90%"),
        (Expect("none", reason="no"), 1.0, "tighten the row"),
        (Expect("partly", 0.5, reason="another reason"), 0.6, "no reason mentions 'another reason'"),
    ],
)
def test_an_outcome_other_than_the_rows_fails(expect: Expect, share: float, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check(result(expect, share, EAGER))


def test_graph_breaks_where_a_row_expects_one_graph_fail_and_the_other_way_round() -> None:
    broken = result(Expect("all"), 1.0, EAGER)
    broken.ort.reports[0].submodules = ["network.head"]
    with pytest.raises(AssertionError, match="regressed; graph breaks at"):
        check(broken)
    check(result(Expect("all"), 1.0, EAGER))
    check(dataclasses.replace(broken, model=dataclasses.replace(broken.model, expect=Expect("all", graph_breaks=True))))
    with pytest.raises(AssertionError, match="tighten the row"):
        check(result(Expect("all", graph_breaks=True), 1.0, EAGER))


def test_early_steps_must_match_within_1e_5() -> None:
    with pytest.raises(AssertionError, match="losses differ"):
        check(result(Expect("all"), 1.0, [2.0, 1.9 + 1e-4, 1.8, 1.7, 1.6]))


def test_later_steps_are_held_to_a_multiple_of_the_measured_noise_floor() -> None:
    later = [2.0, 1.9, 1.8, 1.7 + 1e-3, 1.6]
    with pytest.raises(AssertionError, match="losses differ"):
        check(result(Expect("all"), 1.0, later))  # eager from ulp-moved weights gave the same losses
    noisy = [2.0, 1.9, 1.8 + 2e-4, 1.7, 1.6]  # this model turns one ulp into 2e-4 by step 3
    check(result(Expect("all"), 1.0, later, ulp_losses=noisy))


def test_perturb_by_one_ulp_moves_every_parameter_to_the_next_float() -> None:
    layer = nn.Linear(3, 2)
    before = [p.detach().clone() for p in layer.parameters()]
    perturb_by_one_ulp(layer)
    for old, new in zip(before, layer.parameters(), strict=True):
        assert torch.all(new > old) and torch.equal(torch.nextafter(old, torch.full_like(old, 1e9)), new)


def test_parameter_share_counts_the_modules_ort_ran() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))  # 20 + 10 parameters
    reports = [ORTModuleReport("0", ort_calls=3), ORTModuleReport("1", ort_calls=1, fallback_reason="no")]
    assert ort_parameter_share(model, reports) == (20 / 30, ["0"])
    assert ort_parameter_share(model, [ORTModuleReport("forward", ort_calls=1)]) == (1.0, ["forward"])
