"""when_full: wait with fair_share: the line goes by recent GPU time against shares.

In-process spawners share one admission (an empty cluster, no Kubernetes calls) whose
clock the test holds: the admission and waiting code is the spawner's own, the usage
records are what the usage database would give it.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from traitlets.config import Config

from jupyterhub_gpu.core.budgets import UsageRecord
from jupyterhub_gpu.hub.admission import SpawnAdmission
from jupyterhub_gpu.hub.offline import offline_spawner
from jupyterhub_gpu.hub.spawner import GPUKubeSpawner
from kube_helpers import eventually

HOUR = 3600.0
NOW = 1_800_000_000.0

ADMISSION: SpawnAdmission
CLOCK = [NOW]


@pytest.fixture
def config():
    global ADMISSION
    ADMISSION = SpawnAdmission.empty_cluster()
    CLOCK[0] = NOW
    ADMISSION.clock = lambda: CLOCK[0]
    c = Config()
    c.GPUPolicy.update(
        {
            "when_full": "wait",
            "fair_share": {"half_life": "1h", "max_wait": "10m"},
            "flavors": {"g": {"kind": "gpu"}},
            "profiles": {"p": {"gpu": {"flavor": "g"}}},
            "groups": {
                "lab": {"display_name": "Lab", "quota": {"gpus": 1}, "profiles": ["p"]},
                "research": {"display_name": "Research", "quota": {"gpus": 1}},
                "nlp": {"parent": "research", "quota": {"gpus": 1}, "profiles": ["p"]},
                "cv": {"parent": "research", "quota": {"gpus": 1}, "profiles": ["p"]},
            },
        }
    )
    c.GPUKubeSpawner.wait_poll_interval = 0.05
    return c


def spawner(config, user: str, group: str = "lab") -> GPUKubeSpawner:
    s = offline_spawner(config, user, [group], ADMISSION)
    s.user_options = {"profile": f"{group}--p"}
    return s


def used(
    s: GPUKubeSpawner, group: str, gpus: float, hours_ago: float, hours: float, flavor: str = "g"
) -> None:
    """A server of ``s``'s user held ``gpus`` of ``flavor`` in ``group`` for ``hours``,
    ending ``hours_ago``: a record as the usage database gives it."""
    ended = CLOCK[0] - hours_ago * HOUR
    uid = f"{s.user.name}-{group}-{hours_ago}"
    ADMISSION.count_usage(
        s.gpu_policy,
        UsageRecord(
            uid=uid,
            key=f"ns/{uid}",
            user=s.user.name,
            group=group,
            profile="p",
            flavor=flavor,
            gpus=gpus,
            started=ended - hours * HOUR,
            last_seen=ended,
            ended=ended,
        ),
    )


async def in_line(s: GPUKubeSpawner, text: str) -> None:
    async def says():
        return text in (s._gpu_wait_message or "")

    await eventually(says, f"{s.user.name}'s spawn page to say {text!r}", within=5)


async def second_goes_first(
    holder: GPUKubeSpawner, first: GPUKubeSpawner, second: GPUKubeSpawner, says: str, told: str
) -> None:
    """``holder`` holds Lab's one GPU; ``first`` asks, then ``second``, who is placed
    first (``says``; ``first`` is ``told``) and, when ``holder``'s server stops, gets
    the GPU; ``first`` gets it after."""
    await holder.load_user_options()
    first_waits = asyncio.create_task(first.load_user_options())
    await in_line(first, "position 1 of 1")
    second_waits = asyncio.create_task(second.load_user_options())
    await in_line(second, says)
    await in_line(first, told)
    assert list(ADMISSION.waiting["lab"]) == [second._server_key, first._server_key]
    await holder._release()
    await asyncio.wait_for(second_waits, 5)
    assert not first_waits.done()
    await in_line(first, "Waiting for Lab: position 1 of 1")
    await second._release()
    await asyncio.wait_for(first_waits, 5)


async def test_the_member_who_used_less_starts_first_though_they_asked_second(config):
    ann, bob, cy = (spawner(config, u) for u in ("ann", "bob", "cy"))
    used(bob, "lab", 2, hours_ago=0.5, hours=1)  # bob: 2 GPU-hours half an hour ago
    used(cy, "lab", 1, hours_ago=0.5, hours=0.5)  # cy: half as much
    await second_goes_first(
        ann,
        bob,
        cy,
        "Waiting for Lab: position 1 of 2: you used less GPU time recently than others "
        "waiting; Lab already uses 1 of its 1 GPU, and this server needs 1. The server "
        "starts by itself as soon as there is room; stop it to give up.",
        "Waiting for Lab: position 2 of 2: ahead of you: 1 whose user used less GPU time "
        "recently than you",
    )


async def test_counting_billed_units_who_used_a_heavier_flavor_waits_behind_more_gpu_hours(
    config,
):
    """With ``count: billed_units``, bob's hour on an H200 weighted 3 weighs more than cy's
    two GPU-hours on the weight-1 flavor: cy goes first though bob used half her
    GPU-hours and asked first; the form and the line say billed units."""
    config.GPUPolicy.fair_share = {**config.GPUPolicy.fair_share, "count": "billed_units"}
    config.GPUPolicy.flavors = {
        "g": {"kind": "gpu"},
        "h200": {"kind": "gpu", "billing": {"weight": 3}},
    }
    ann, bob, cy = (spawner(config, u) for u in ("ann", "bob", "cy"))
    used(bob, "lab", 1, hours_ago=0.5, hours=1, flavor="h200")  # 1 GPU-hour: 3 units
    used(cy, "lab", 2, hours_ago=0.5, hours=1)  # 2 GPU-hours: 2 units
    (entry,) = await bob._gpu_profile_list(bob)
    # bob: 3 ∫ 2^(-t/1h) dt from 0.5 h to 1.5 h ago = 3 (2^-0.5 - 2^-1.5) / ln 2 = 1.53
    # billed units, 3 of the 5 Lab's members used: 0.6 against half, 1.20 x
    assert (
        "Lab fair share: you used 1.5 billed units recently (half-life 1 hour), 1.20 x your "
        "share" in entry["description"]
    )
    await second_goes_first(
        ann,
        bob,
        cy,
        "Waiting for Lab: position 1 of 2: you used fewer billed units recently than others "
        "waiting; Lab already uses 1 of its 1 GPU",
        "Waiting for Lab: position 2 of 2: ahead of you: 1 whose user used fewer billed "
        "units recently than you",
    )


async def test_a_sibling_group_that_used_less_goes_first_under_a_full_parent(config):
    ann, dee = spawner(config, "ann", "nlp"), spawner(config, "dee", "nlp")
    eve = spawner(config, "eve", "cv")
    used(ann, "nlp", 4, hours_ago=1, hours=1)  # nlp used a lot; cv a little
    used(eve, "cv", 1, hours_ago=1, hours=1)
    await ann.load_user_options()  # ann (nlp) holds Research's one GPU
    dee_waits = asyncio.create_task(dee.load_user_options())
    await in_line(dee, "position 1 of 1")
    eve_waits = asyncio.create_task(eve.load_user_options())
    await in_line(
        eve, "position 1 of 2: you used less GPU time recently than others waiting; Research"
    )
    await in_line(
        dee,
        "position 2 of 2: ahead of you: 1 whose group used less GPU time recently for its "
        "share than yours",
    )
    await ann._release()
    await asyncio.wait_for(eve_waits, 5)  # cv's member, who asked second
    assert not dee_waits.done()
    await eve._release()
    await asyncio.wait_for(dee_waits, 5)


async def test_a_server_that_waited_max_wait_goes_first_whatever_its_standing(config):
    ann, bob, cy = (spawner(config, u) for u in ("ann", "bob", "cy"))
    used(bob, "lab", 8, hours_ago=0.1, hours=1)  # bob used far more than cy
    await ann.load_user_options()
    bob_waits = asyncio.create_task(bob.load_user_options())
    await in_line(bob, "position 1 of 1")
    CLOCK[0] += 9 * 60
    cy_waits = asyncio.create_task(cy.load_user_options())
    await in_line(cy, "position 1 of 2: you used less GPU time recently")
    CLOCK[0] += 2 * 60  # bob has waited 11 minutes: past max_wait (10m)
    await in_line(bob, "position 1 of 2: you have waited longer than 10 minutes, so you go first")
    await in_line(cy, "position 2 of 2: ahead of you: 1 waited longer than 10 minutes")
    await ann._release()
    await asyncio.wait_for(bob_waits, 5)
    assert not cy_waits.done()
    await bob._release()
    await asyncio.wait_for(cy_waits, 5)


async def test_old_usage_decays_so_recent_use_weighs_more(config):
    ann, bob, cy = (spawner(config, u) for u in ("ann", "bob", "cy"))
    # bob used 8 GPU-hours five half-lives ago (a 32nd of it counts now); cy 1 just now
    used(bob, "lab", 8, hours_ago=5, hours=1)
    used(cy, "lab", 1, hours_ago=0, hours=1)
    await ann.load_user_options()
    cy_waits = asyncio.create_task(cy.load_user_options())
    await in_line(cy, "position 1 of 1")
    bob_waits = asyncio.create_task(bob.load_user_options())
    await in_line(bob, "position 1 of 2: you used less GPU time recently")
    book = ADMISSION.fair
    # ∫ 8 · 2^(-t/1h) dt from 5 h to 6 h ago
    assert book.member_usage("bob", "lab", CLOCK[0]) == pytest.approx(
        8 * (2**-5 - 2**-6) / math.log(2)
    )
    # an hour on, both have decayed by half: the order stands
    CLOCK[0] += 5 * 60
    assert book.member_usage("cy", "lab", CLOCK[0] + HOUR) == pytest.approx(
        book.member_usage("cy", "lab", CLOCK[0]) / 2
    )
    await ann._release()
    await asyncio.wait_for(bob_waits, 5)
    assert not cy_waits.done()
    await bob._release()
    await asyncio.wait_for(cy_waits, 5)


async def test_the_spawn_form_shows_the_users_and_groups_standing(config):
    bob, cy = spawner(config, "bob"), spawner(config, "cy")
    used(bob, "lab", 3, hours_ago=0, hours=1)
    used(cy, "lab", 1, hours_ago=0, hours=1)
    (entry,) = await bob._gpu_profile_list(bob)
    # bob used 3 of Lab's 4 GPU-hours (2.16 decayed: ∫ 3 · 2^(-t/1h) over the last
    # hour, said as 2.2) with one of two members' shares: 1.5 x; Lab used all the top
    # level's GPU time with a third of its shares (lab, research and everyone): 3 x
    assert (
        "Lab fair share: you used 2.2 GPU-hours recently (half-life 1 hour), 1.50 x your "
        in (entry["description"])
    )
    assert entry["description"].endswith("Lab 3.00 x its share")


async def test_usage_counted_while_waiting_reorders_the_line_within_a_second(config):
    ann, bob, cy = (spawner(config, u) for u in ("ann", "bob", "cy"))
    used(bob, "lab", 2, hours_ago=0.5, hours=1)
    await ann.load_user_options()
    bob_waits = asyncio.create_task(bob.load_user_options())
    cy_waits = asyncio.create_task(cy.load_user_options())
    await in_line(cy, "position 1 of 2: you used less GPU time recently")
    # a join works out the newcomer's standing only, for the moment the others' were
    # worked out: they stand for up to a second
    dee = spawner(config, "dee")
    dee_waits = asyncio.create_task(dee.load_user_options())
    await in_line(dee, "position 2 of 3")  # used nothing, as cy: behind cy, who came first
    moments = {ADMISSION.line.get(s._server_key).standing_at for s in (bob, cy, dee)}
    assert len(moments) == 1, moments
    # cy's earlier server is counted now (3 GPU-hours): a second on, the line says so
    used(cy, "lab", 6, hours_ago=0.1, hours=0.5)
    CLOCK[0] += 1
    await in_line(cy, "position 3 of 3")
    await in_line(bob, "position 2 of 3")
    await in_line(dee, "position 1 of 3")
    assert {ADMISSION.line.get(s._server_key).standing_at for s in (bob, cy, dee)} == {CLOCK[0]}
    for waits in (bob_waits, cy_waits, dee_waits):
        waits.cancel()
    await asyncio.gather(bob_waits, cy_waits, dee_waits, return_exceptions=True)


async def test_a_newcomer_is_measured_against_the_line_at_the_same_moment(config):
    """Lab's usage grows while ann's server runs, so a standing worked out half a second
    later is higher: cy, who used less than bob, joins half a second after him and
    still goes first, their group compared at one moment."""
    ann, bob, cy = (spawner(config, u) for u in ("ann", "bob", "cy"))
    used(bob, "lab", 2, hours_ago=0.5, hours=1)
    used(cy, "lab", 1, hours_ago=0.5, hours=0.5)
    await ann.load_user_options()  # ann holds Lab's one GPU, and her server runs on
    ADMISSION.count_usage(
        ann.gpu_policy,
        UsageRecord("ann-now", ann._server_key, "ann", "lab", "p", "g", 1.0, NOW, NOW),
    )
    bob_waits = asyncio.create_task(bob.load_user_options())
    await in_line(bob, "position 1 of 1")
    CLOCK[0] += 0.5
    cy_waits = asyncio.create_task(cy.load_user_options())
    await in_line(cy, "position 1 of 2: you used less GPU time recently than others waiting")
    assert list(ADMISSION.waiting["lab"]) == [cy._server_key, bob._server_key]
    for waits in (bob_waits, cy_waits):
        waits.cancel()
    await asyncio.gather(bob_waits, cy_waits, return_exceptions=True)
