"""One way to write numbers, units, durations and times: the hub's (``core.words``),
the JupyterLab extension's (``jupyterlab-gpu/src/words.ts``) and the dashboard's
script agree on every sample."""

from __future__ import annotations

from datetime import datetime
from fractions import Fraction
from zoneinfo import ZoneInfo

import pytest
from lab_helpers import run

from jupyterhub_gpu.core import words
from jupyterhub_gpu.service.page import LOCAL_MOMENTS_JS

#: numbers said together, as messages say them: each list one message's
NUMBERS = [
    [0.025, 0.025],
    [20.5, 20],
    [2000.0, 2000],
    [1999.96, 2000],
    [2000.004, 2000],
    [99.99999, 100],
    [0.0125],
    [2.25],
    [0.125],
    [12.35],
    [0.1 + 0.2, 0.3],
    [0],
    [0.00001],
    [1e-9],
    [123456.78],
    [7.5999, 7.6],
    [1.0, 1.04, 1.05],
]
DURATIONS = [0, 0.4, 0.5, 1, 45, 59.6, 60, 90, 119, 3599, 3600, 5400, 8 * 3600 + 5, 86400]
DURATIONS += [2 * 86400 + 4 * 3600 + 50, 7 * 86400, 36 * 3600, 30 * 86400]
#: 2026-12-01 14:05:59 UTC (in winter), 2026-07-01 23:30 UTC (in summer), the epoch
MOMENTS = [1796133959.0, 1782948600.0, 0.0]


def test_the_issues_cases_read_right():
    assert "{} of {}".format(*words.numbers([0.025, 0.025])) == "0.025 of 0.025"
    assert "{} of {}".format(*words.numbers([20.5, 20])) == "20.5 of 20"
    assert "{} of {}".format(*words.numbers([2000.0, 2000])) == "2000 of 2000"
    # two different numbers never read the same: more decimals for both
    assert words.numbers([1999.96, 2000]) == ["1999.96", "2000"]
    assert words.numbers([2000.004, 2000]) == ["2000.004", "2000"]
    # up to four decimals: beyond that, the difference is noise
    assert words.numbers([99.99999, 100]) == ["100", "100"]
    assert words.count(1, "spawn") == "1 spawn"
    assert words.count(2, "spawn") == "2 spawns"
    assert words.gpu_hours(1) == "1 GPU-hour"
    assert words.gpu_hours(0.5) == "0.5 GPU-hours"
    assert words.gpus(Fraction(1, 3)) == "0.33 GPUs"
    assert words.number(12345.6, grouped=True) == "12,345.6"


def test_halves_round_up_and_nothing_reads_in_exponents():
    assert words.number(2.25) == "2.3"  # Python's own formatting says 2.2
    assert words.number(0.00001) == "0.00001"
    assert words.number(1e-9) == "0"
    assert words.number(-0.0) == "0"


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0, "0 seconds"),
        (1, "1 second"),
        (45, "45 seconds"),
        (60, "1 minute"),
        (90, "1 minute 30 seconds"),
        (5400, "1 hour 30 minutes"),
        (8 * 3600 + 5, "8 hours"),
        (86400, "1 day"),
        (36 * 3600, "1 day 12 hours"),
        (2 * 86400 + 4 * 3600 + 50, "2 days 4 hours"),
        (899.9999, "15 minutes"),
    ],
)
def test_durations_in_words_two_largest_units(seconds, said):
    assert words.duration(seconds) == said


def test_a_window_after_the_last_has_no_lone_one():
    assert words.period(86400) == "day"
    assert words.period(3600) == "hour"
    assert words.period(7 * 86400) == "7 days"
    assert words.period(5400) == "1 hour 30 minutes"


def test_a_moment_is_minutes_in_utc_said_once():
    assert words.moment(MOMENTS[0]) == "2026-12-01 14:05 UTC"


def test_the_extension_writes_every_sample_as_the_hub_does():
    data = {"numbers": NUMBERS, "durations": DURATIONS, "moments": MOMENTS}
    said = run(
        """
        result = {
          numbers: data.numbers.map(words.numbers),
          durations: data.durations.map(words.duration),
          periods: data.durations.map(words.period),
          moments: data.moments.map(words.moment),
          counts: [0, 1, 2, 0.5].map(n => words.count(n, "spawn")),
          hours: [1, 2, 0.025].map(words.gpuHours),
        };
        """,
        data,
    )
    assert said == {
        "numbers": [words.numbers(values) for values in NUMBERS],
        "durations": [words.duration(s) for s in DURATIONS],
        "periods": [words.period(s) for s in DURATIONS],
        "moments": [words.moment(m) for m in MOMENTS],
        "counts": [words.count(n, "spawn") for n in (0, 1, 2, 0.5)],
        "hours": [words.gpu_hours(h) for h in (1, 2, 0.025)],
    }


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"])
def test_the_extension_and_the_dashboard_say_the_hubs_moments_in_the_readers_zone(zone):
    texts = [f"stops at {words.moment(m)}, in 10 minutes" for m in MOMENTS]
    texts.append(f"between {words.moment(MOMENTS[0])} and {words.moment(MOMENTS[1])}")
    said = run(
        LOCAL_MOMENTS_JS
        + """
        result = {
          lab: data.texts.map(words.localTimes),
          page: data.texts.map(localMoments),
          moments: data.moments.map(words.moment),
        };
        """,
        {"texts": texts, "moments": MOMENTS},
        tz=zone,
    )
    # the dashboard's script and the extension say the same
    assert said["lab"] == said["page"]
    for epoch, text, shown in zip(MOMENTS, texts, said["lab"], strict=False):
        local = datetime.fromtimestamp(epoch, ZoneInfo(zone))
        assert shown.startswith(f"stops at {local:%Y-%m-%d %H:%M} "), shown
        assert shown.endswith(", in 10 minutes"), shown
        named = shown.removesuffix(", in 10 minutes").rsplit(" ", 1)[1]
        # the reader's zone named once (Intl's short name: EST, GMT+1, ...)
        assert named, shown
        assert (named == "UTC") == (zone == "UTC"), shown
        said_alone = said["moments"][MOMENTS.index(epoch)]
        assert shown == f"stops at {said_alone}, in 10 minutes"
        if zone == "UTC":
            assert shown == text  # a reader in UTC reads the hub's own words
