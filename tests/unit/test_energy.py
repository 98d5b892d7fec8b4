"""Showback's energy (pure): which servers' GPU power is their own, a session's kWh
from its mean power and its time, what the energy covers, the JSON, CSV and
dashboard figures, and the simulated exporter's power and energy counter."""

from __future__ import annotations

import csv
import io
from fractions import Fraction
from zoneinfo import ZoneInfo

import pytest
from prometheus_client.core import Metric

from jupyterhub_gpu.config.values import service_setting_errors
from jupyterhub_gpu.core.energy import holds_whole_devices, kwh, unmetered_flavors
from jupyterhub_gpu.core.model import Flavor, parse_policy
from jupyterhub_gpu.core.showback import month_bounds, sessions_of, showback
from jupyterhub_gpu.core.showback_tally import ShowbackTally
from jupyterhub_gpu.core.usage import UsageRecord
from jupyterhub_gpu.core.utilisation import Chunks, Coverage, Reading
from jupyterhub_gpu.service.showback_page import showback_section
from jupyterhub_gpu.service.time_views import showback_csv, showback_json
from jupyterhub_gpu.service.utilisation import (
    POWER_USAGE,
    TOTAL_ENERGY,
    chunk_query,
    parse_reading,
)
from jupyterhub_gpu.service.views import Viewer
from jupyterhub_gpu_dev.dcgm_dra import ENGINE_ACTIVE, GPU_UTIL
from jupyterhub_gpu_dev.dcgm_power import EnergyMeter, power_families, power_watts

H = 3600.0
DAY = 86400.0
MONTH = "2026-11"
NOV, DEC = month_bounds(MONTH)
POLICY = parse_policy(
    flavors={
        "h200": {"kind": "gpu"},
        "shared": {"kind": "timeslice", "replicas": 4},
        "mig-1g": {"kind": "mig", "profile": "1g.5gb"},
        "mig-7g": {"kind": "mig", "profile": "7g.80gb"},
    },
    profiles={
        "gpu": {"gpu": {"flavor": "h200"}},
        "light": {"gpu": {"flavor": "shared"}},
        "slice": {"gpu": {"flavor": "mig-1g"}},
        "whole-mig": {"gpu": {"flavor": "mig-7g"}},
    },
    groups={
        "faculty": {"quota": {"gpus": 64}, "profiles": ["gpu", "light", "slice", "whole-mig"]},
        "lab": {"parent": "faculty", "quota": {"gpus": 8}, "profiles": ["gpu", "slice"]},
        "course": {"quota": {"gpus": 8}, "profiles": ["light", "whole-mig"]},
    },
)
ADMIN = Viewer(name="root", admin=True)


def record(uid, group, user, flavor, gpus, start, end) -> UsageRecord:
    return UsageRecord(uid, f"ns/jupyter-{user}", user, group, "p", flavor, gpus, start, end, end)


def flavor(kind: str, **fields) -> Flavor:
    return Flavor(name=kind, kind=kind, display_name=kind, **fields)


@pytest.mark.parametrize(
    ("made", "whole"),
    [
        (flavor("gpu"), True),
        (flavor("mig", mig_profile="1g.5gb"), False),
        (flavor("mig", mig_profile="3g.40gb"), False),
        (flavor("mig", mig_profile="7g.80gb"), True),  # the whole parent GPU
        (flavor("timeslice", replicas=4), False),
        (flavor("mps", replicas=2), False),
        (flavor("fraction", gpu_fraction=Fraction(1, 2)), False),
        (flavor("hami", gpu_memory=1000), False),
        (flavor("dra", device_class="gpu.nvidia.com"), True),
        (flavor("dra", device_class="mig.nvidia.com"), False),
        (flavor("dra", device_class="gpu.nvidia.com", sharing="TimeSlicing"), False),
        (
            flavor("dra", selectors=("device.attributes['gpu.nvidia.com'].profile == '2g.10gb'",)),
            False,
        ),
    ],
)
def test_only_a_server_holding_its_gpus_whole_has_their_power(made, whole):
    assert holds_whole_devices(made) is whole


def test_the_policys_unmetered_flavors_are_its_shared_devices_and_mig_slices():
    assert unmetered_flavors(POLICY) == {"shared", "mig-1g"}


def test_a_sessions_energy_is_its_mean_power_over_its_own_time_with_all_its_gpus():
    """ann's server held 2 H200s for 3 hours at 800 W together: 2.4 kWh, 6 GPU-hours
    metered; bob's on a time-sliced GPU and cat's on a MIG slice have series (the
    device's power), and are never given it; dan's had no power series."""
    records = [
        record("a", "lab", "ann", "h200", 2.0, NOV + H, NOV + 4 * H),
        record("b", "lab", "bob", "shared", 0.25, NOV, NOV + 8 * H),
        record("c", "lab", "cat", "mig-1g", 1 / 7, NOV, NOV + 7 * H),
        record("d", "lab", "dan", "h200", 1.0, NOV, NOV + 5 * H),
        # began in October: only its November hours count, at its mean power there
        record("e", "course", "eve", "mig-7g", 1.0, NOV - 2 * H, NOV + 2 * H),
    ]
    power = {"a": 800.0, "b": 400.0, "c": 300.0, "e": 500.0}
    result = showback(records, NOV, DEC, DEC, power=power, unmetered=unmetered_flavors(POLICY))
    assert result.metered == {("lab", "ann", "h200"): 6.0, ("course", "eve", "mig-7g"): 2.0}
    assert result.energy == {
        ("lab", "ann", "h200"): pytest.approx(2.4),
        ("course", "eve", "mig-7g"): pytest.approx(1.0),
    }
    assert kwh(-20.0, H) == 0.0  # a negative mean (a counter gone wrong) adds nothing

    view = showback_json(
        MONTH, result, ADMIN, True, None, {}, POLICY.charged_groups, "UTC", POLICY, 350.0
    )
    groups = {g["group"]: g for g in view["groups"]}
    # faculty, lab's parent, sums its child's
    assert groups["faculty"]["energy_kwh"] == groups["lab"]["energy_kwh"] == pytest.approx(2.4)
    assert groups["lab"]["emissions_kg"] == pytest.approx(2.4 * 0.35)
    assert groups["lab"]["energy_measured_gpu_hours"] == 6.0
    users = {u["user"]: u for u in view["users"]}
    assert users["bob"]["energy_kwh"] is None  # nothing measured: not a zero
    assert view["emissions_factor_g_per_kwh"] == 350.0
    # no Prometheus read: no coverage at all
    assert view["energy_coverage"] is None


def test_the_energy_coverage_says_what_was_never_measured_and_what_had_no_series():
    records = [
        record("a", "lab", "ann", "h200", 2.0, NOV, NOV + 3 * H),
        record("b", "lab", "bob", "shared", 0.25, NOV, NOV + 8 * H),
        record("c", "lab", "cat", "mig-1g", 1 / 7, NOV, NOV + 7 * H),
        record("d", "course", "dan", "h200", 1.0, NOV, NOV + 5 * H),
    ]
    readings = Coverage(NOV, NOV + DAY, DAY - 2 * H, ((NOV, NOV + 2 * H),))
    result = showback(
        records, NOV, NOV + DAY, NOV + DAY, power={"a": 700.0}, unmetered={"shared", "mig-1g"}
    )
    from dataclasses import replace

    result = replace(result, coverage=readings)
    view = showback_json(MONTH, result, ADMIN, True, None, {}, POLICY.charged_groups, "UTC", POLICY)
    coverage = view["energy_coverage"]
    assert coverage["gpu_hours"] == pytest.approx(6 + 2 + 1 + 5)
    assert coverage["measured_gpu_hours"] == pytest.approx(6)
    assert coverage["shared_gpu_hours"] == pytest.approx(3)  # 2 time-sliced, 1 MIG slice
    assert coverage["gpu_hours_without_series"] == pytest.approx(5)  # dan's
    assert coverage["hours_without_data"] == pytest.approx(2)
    assert not coverage["complete"]
    assert coverage["note"] == (
        "energy: 3 GPU-hours on shared GPUs or MIG slices not measured, "
        "5 GPU-hours without power series, no data for 2 hours"
    )
    # a member of lab sees lab's part: dan's hours in course are not theirs
    member = Viewer(name="ann", groups=frozenset({"lab"}))
    mine = showback_json(
        MONTH, result, member, False, {"lab"}, {}, POLICY.charged_groups, "UTC", POLICY
    )["energy_coverage"]
    assert mine["gpu_hours_without_series"] == 0
    assert mine["note"] == (
        "energy: 3 GPU-hours on shared GPUs or MIG slices not measured, no data for 2 hours"
    )


def test_the_csv_keeps_its_columns_and_adds_energy_and_emissions_at_the_end():
    records = [
        record("a", "lab", "ann", "h200", 1.0, NOV, NOV + 2 * H),
        record("b", "lab", "bob", "shared", 0.25, NOV, NOV + 8 * H),
    ]
    result = showback(records, NOV, DEC, DEC, power={"a": 450.0}, unmetered={"shared"})
    first = [
        "month",
        "group",
        "user",
        "flavor",
        "gpu_hours",
        "measured_gpu_hours",
        "utilised_gpu_hours",
        "utilised_coverage",
        "account",
        "billed_units",
        "cost",
        "currency",
    ]
    plain = list(csv.reader(io.StringIO(showback_csv(MONTH, result, ADMIN, True, None, POLICY))))
    assert plain[0] == [*first, "energy_kwh"]
    rows = {row[2]: row for row in plain[1:]}
    assert rows["ann"][-1] == "0.9000"
    assert rows["bob"][-1] == ""  # on a shared GPU: not measured
    factored = showback_csv(MONTH, result, ADMIN, True, None, POLICY, 400.0)
    lines = list(csv.DictReader(io.StringIO(factored)))
    assert list(lines[0]) == [*first, "energy_kwh", "emissions_kg"]
    assert {row["user"]: row["emissions_kg"] for row in lines} == {"ann": "0.3600", "bob": ""}


def test_the_dashboard_shows_kwh_per_group_only_when_some_was_measured():
    records = [record("a", "lab", "ann", "h200", 1.0, NOV, NOV + 2 * H)]
    measured = showback(records, NOV, DEC, DEC, power={"a": 450.0})
    unmeasured = showback(records, NOV, DEC, DEC)

    def section(result, factor=None) -> str:
        view = showback_json(
            MONTH, result, ADMIN, True, None, {}, POLICY.charged_groups, "UTC", POLICY, factor
        )
        return showback_section(view, admin=True)

    assert ">kWh</th>" not in section(unmeasured)
    page = section(measured)
    # beside the busy GPU-hours (both from DCGM); billing's columns stay last
    assert page.index("Busy GPU-hours</th>") < page.index(">kWh</th>") < page.index(">Budget</th>")
    table = page.split('<table class="showback">')[1].split("</table>")[0]
    for row in table.split("</tr>")[1:-1]:
        assert row.count("<td") == table.split("</tr>")[0].count("<th")
    assert '<td class="num">0.9</td>' in page
    assert "kg CO₂e" not in page
    page = section(measured, 500.0)
    assert "kg CO₂e</th>" in page
    assert '<td class="num">0.45</td>' in page


def test_two_sessions_of_one_pod_name_each_get_their_own_power_and_the_tally_keeps_it():
    """ann's server ran busy on the 2nd and idle on the 4th as a pod of one name:
    each session's energy is its own days' power times its own time, whether summed
    from the records or kept in the month tally once final."""
    zone = ZoneInfo("UTC")
    key = "jhub/jupyter-ann"
    chunks = Chunks(zone=zone)
    # the counter's mean on the 2nd (in watts, as the reader keeps it); the gauge alone
    # on the 4th
    for day, metric, watts in ((1, TOTAL_ENERGY, 650.0), (3, POWER_USAGE, 90.0)):
        start = NOV + day * DAY
        chunks.put(
            Reading(
                start,
                start + DAY,
                {metric: {key: watts * 100}},
                {metric: {key: 100}},
                DAY,
                NOV + 9 * DAY,
            )
        )
    records = [
        UsageRecord("s1", key, "ann", "lab", "gpu", "h200", 1.0, NOV + DAY, NOV, NOV + DAY + 4 * H),
        UsageRecord(
            "s2", key, "ann", "lab", "gpu", "h200", 1.0, NOV + 3 * DAY, NOV, NOV + 3 * DAY + 2 * H
        ),
    ]
    now = NOV + 9 * DAY
    sessions = sessions_of(records, NOV, now, now)
    (busy, power), coverage = chunks.means(
        NOV, now, [["DCGM_FI_DEV_GPU_UTIL"], [TOTAL_ENERGY, POWER_USAGE]], sessions
    )
    assert busy == {}
    assert power == {"s1": pytest.approx(650.0), "s2": pytest.approx(90.0)}
    assert coverage.final == {"s1", "s2"}
    summed = showback(records, NOV, now, now, power=power)
    assert summed.energy == {("lab", "ann", "h200"): pytest.approx(0.65 * 4 + 0.09 * 2)}
    tally = ShowbackTally(zone, unmetered={"shared"})
    for r in records:
        tally.put(r, now)
    assert tally.showback(MONTH, now, power=power).energy == summed.energy
    tally.finalise(MONTH, [("s1", None, records[0].ended)], power)
    # s1 kept for good: only s2 given from now on, the same answer
    assert tally.showback(MONTH, now, power={"s2": 90.0}).energy == {
        ("lab", "ann", "h200"): pytest.approx(0.65 * 4 + 0.09 * 2)
    }
    assert tally.showback(MONTH, now, power={"s2": 90.0}).metered == {("lab", "ann", "h200"): 6.0}


def test_a_chunks_answer_gives_each_pods_power_in_watts():
    query = chunk_query(NOV, NOV + DAY)
    # the counter: its increase (mJ) between the samples its first and last steps see,
    # and the seconds between them; the gauge: its samples summed, and counted. Per pod
    # the increases summed over its series, and the longest time, the most samples
    energy = f'{TOTAL_ENERGY}{{pod!=""}}'
    assert f"max_over_time({energy}[86399999ms:60s] @ {NOV + DAY:.3f})" in query
    assert f"min_over_time(timestamp({energy})[86399999ms:60s] @ {NOV + DAY:.3f})" in query
    assert (
        f"unless on (namespace, pod) (resets({energy}[86399999ms] @ {NOV + DAY:.3f}) > 0)" in query
    )
    assert f'max by (namespace, pod) (count_over_time({POWER_USAGE}{{pod!=""}}' in query
    pod = {"namespace": "ns", "pod": "jupyter-ann"}
    answer = [
        # 1,300 J over 2 seconds
        {"metric": {**pod, "part": f"{TOTAL_ENERGY}:sum"}, "value": [0, "1300000"]},
        {"metric": {**pod, "part": f"{TOTAL_ENERGY}:count"}, "value": [0, "2"]},
        {"metric": {**pod, "part": f"{POWER_USAGE}:sum"}, "value": [0, "1200"]},
        {"metric": {**pod, "part": f"{POWER_USAGE}:count"}, "value": [0, "2"]},
    ]
    reading = parse_reading(answer, NOV, NOV + DAY, NOV + DAY)
    chunks = Chunks()
    chunks.put(reading)
    (power, gauge), _ = chunks.means(NOV, NOV + DAY, [[TOTAL_ENERGY, POWER_USAGE], [POWER_USAGE]])
    assert power == {"ns/jupyter-ann": pytest.approx(650.0)}  # the counter wins
    assert gauge == {"ns/jupyter-ann": pytest.approx(600.0)}


@pytest.mark.parametrize("bad", ["lots", -1, True, [350]])
def test_a_wrong_emissions_factor_is_an_error_naming_the_setting(bad):
    errors = service_setting_errors({"GPUService": {"emissions_factor": bad}})
    assert errors == [
        "hub.config.GPUService.emissions_factor: expected grams of CO2 per kWh "
        f"(a number, 0 or more, such as 350), got {bad!r}"
    ]
    assert service_setting_errors({"GPUService": {"emissions_factor": 350}}) == []


def _utilisation(*samples: tuple[str, dict, float]) -> list[Metric]:
    util = Metric(GPU_UTIL, "", "gauge")
    engine = Metric(ENGINE_ACTIVE, "", "gauge")
    for name, labels, value in samples:
        (util if name == GPU_UTIL else engine).add_sample(name, labels, value)
    return [util, engine]


def test_the_simulated_exporters_power_follows_utilisation_and_its_counter_integrates_it():
    h200 = {"modelName": "NVIDIA H200 NVL", "Hostname": "n1"}
    pod = {"namespace": "ns", "pod": "jupyter-ann"}
    usage = _utilisation(
        # ann holds two whole GPUs, busy at 50 %
        (GPU_UTIL, {**h200, "UUID": "GPU-0", **pod}, 50.0),
        (GPU_UTIL, {**h200, "UUID": "GPU-1", **pod}, 50.0),
        (GPU_UTIL, {**h200, "UUID": "GPU-2"}, 0.0),  # nobody's
        # two MIG instances of one A100: 1g at full use, 3g at half
        (
            ENGINE_ACTIVE,
            {
                "modelName": "NVIDIA A100",
                "UUID": "GPU-9",
                "GPU_I_PROFILE": "1g.5gb",
                "GPU_I_ID": "1",
                "namespace": "ns",
                "pod": "jupyter-bob",
            },
            1.0,
        ),
        (
            ENGINE_ACTIVE,
            {
                "modelName": "NVIDIA A100",
                "UUID": "GPU-9",
                "GPU_I_PROFILE": "3g.20gb",
                "GPU_I_ID": "2",
                "namespace": "ns",
                "pod": "jupyter-cat",
            },
            0.5,
        ),
    )
    meter = EnergyMeter()
    families, per_pod = power_families(usage, meter, now=1000.0)
    gauge, counter = families
    watts = {s.labels["UUID"]: s.value for s in gauge.samples}
    assert watts["GPU-0"] == watts["GPU-1"] == power_watts("NVIDIA H200 NVL", 50) == 380.0
    assert watts["GPU-2"] == 60.0  # idle
    # the A100 is (1 x 100 % + 3 x 50 %) / 7 busy; both instances report its power
    parent = power_watts("NVIDIA A100", 250 / 7)
    assert [s.value for s in gauge.samples if s.labels["UUID"] == "GPU-9"] == [parent, parent]
    assert per_pod[("ns", "jupyter-ann")] == 760.0
    assert per_pod[("ns", "jupyter-bob")] == per_pod[("ns", "jupyter-cat")] == parent
    before = {s.labels["UUID"]: s.value for s in counter.samples}
    # 10 s later, ann's GPUs went idle: the counter adds what was drawn meanwhile
    usage[0].samples[:] = [
        s._replace(value=0.0) if s.labels["UUID"] in ("GPU-0", "GPU-1") else s
        for s in usage[0].samples
    ]
    families, per_pod = power_families(usage, meter, now=1010.0)
    after = {s.labels["UUID"]: s.value for s in families[1].samples}
    assert after["GPU-0"] - before["GPU-0"] == pytest.approx(380.0 * 10 * 1000)
    assert after["GPU-2"] - before["GPU-2"] == pytest.approx(60.0 * 10 * 1000)
    assert per_pod[("ns", "jupyter-ann")] == 120.0
    # a driver reloaded: that GPU's counter starts again from zero, the others run on
    meter.reset(["GPU-2"])
    assert meter.read("GPU-2", 60.0, 1015.0) == pytest.approx(60.0 * 5 * 1000)
    assert meter.read("GPU-0", 60.0, 1015.0) > after["GPU-0"]
    # an exporter whose counters file lacks the counter (or the gauge) for a pod
    families, _ = power_families(
        usage, meter, now=1020.0, published=lambda ns, name: (name != "jupyter-bob", False)
    )
    assert {s.labels.get("pod") for s in families[0].samples} == {
        None,
        "jupyter-ann",
        "jupyter-cat",
    }
    assert {s.labels.get("pod") for s in families[1].samples} == {None}  # nobody's GPU
