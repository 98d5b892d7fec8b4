"""The demo's fair share: the built-in example's research members start with
different histories, so their standings differ from the first minute, and the
walkthrough says what to look at. The demo itself runs in test_demo.py."""

from __future__ import annotations

import time
from dataclasses import replace

from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.budgets import gpu_hours
from jupyterhub_gpu.core.fairshare import FairShareBook, read_window
from jupyterhub_gpu_dev.demo import (
    DEMO_VALUES,
    FAIR_SHARE_HISTORY,
    plan_demo,
    seed_fair_share_history,
)
from jupyterhub_gpu_dev.demo_walkthrough import _fair_share_step


def test_the_built_in_examples_research_members_have_different_standings(tmp_path):
    plan = plan_demo([])
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    now = time.time()
    said = seed_fair_share_history(plan, url, now)
    assert said == [
        "fair share: an earlier day of Research stood in (research-1 2 GPU-hours, "
        "research-2 0.25 GPU-hours)"
    ]
    store = UsageStore(url)
    records = store.overlapping(now - read_window(plan.policy), now + 1)
    store.dispose()
    book = FairShareBook(plan.policy)
    for record in records:
        book.put(record)
    heavy = book.member_standing("research-1", "research", now)
    light = book.member_standing("research-2", "research", now)
    # a day's half-life: two hours ending three hours ago count ~89% (at their middle)
    assert abs(heavy.usage - FAIR_SHARE_HISTORY[0] * 2 ** (-4 / 24)) < 0.01
    assert heavy.standing > 1 > light.standing
    # no budget counts it: the history ended before research's one-hour window
    window = plan.policy.groups["research"].user_budget.period
    assert gpu_hours(records, now - window, now, ()) == 0


def test_the_walkthrough_says_where_standings_show_and_how_to_see_the_line():
    standings, line = _fair_share_step(plan_demo([]))
    assert standings.startswith("Fair share (half-life 1 day): research-1 held a GPU 2 hours")
    assert "Research fair share: you used ... x your share" in standings
    # the line the demo test walks through (test_demo.py), with the flavor research
    # may hold one of at a time and the profile that offers it
    assert line.startswith(
        "The line: Research may hold one NVIDIA A100 40GB at a time and waits for it. "
        "As research-1, start a Research server on it (it runs), then a named server"
    )
    assert "research-2's starts though it asked second" in line


def test_without_a_group_that_waits_the_walkthrough_shows_no_line():
    plan = plan_demo([])
    research = plan.policy.groups["research"]
    refusing = replace(
        plan,
        policy=replace(
            plan.policy,
            groups={**plan.policy.groups, "research": replace(research, when_full=None)},
        ),
    )
    assert refusing.policy.when_full_of("research") == "refuse"
    assert len(_fair_share_step(refusing)) == 1


def test_a_sites_own_values_get_no_invented_history(tmp_path):
    plan = plan_demo([str(DEMO_VALUES)])
    assert plan.values_files == [DEMO_VALUES]  # the same file named: still the example
    other = tmp_path / "values.yaml"
    other.write_text(DEMO_VALUES.read_text())
    mine = plan_demo([str(other)])
    assert seed_fair_share_history(mine, f"sqlite:///{tmp_path / 'u.sqlite'}", 0) == []
    assert _fair_share_step(mine) is None
