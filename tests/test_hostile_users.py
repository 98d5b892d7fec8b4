"""Users who send anything: every bad spawn is a one-line refusal, and none stops the hub.

Arbitrary JSON ``user_options`` go through the spawner's own validation offline
(a property test); then a real hub with ``consecutive_failure_limit`` below the
number of bad spawns gets them over its REST API and must still be serving.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from traitlets.config import Config

from hub_helpers import api, stop_server, wait_no_pods
from jupyterhub_gpu.config.values import policy_from_config
from jupyterhub_gpu.core.selection import ECHO_LIMIT, Malformed, Refused, select, shown
from jupyterhub_gpu.hub.offline import offline_spawner
from jupyterhub_gpu.hub.spawner import SpawnRefused
from kube_helpers import eventually

POLICY = {
    "flavors": {
        "h200": {"kind": "gpu"},
        "shared": {"kind": "timeslice", "replicas": 4},
    },
    "profiles": {
        "research": {
            "cpu": "100m",
            "memory": "128Mi",
            "gpu": {"flavor": "h200"},
            "options": {
                "gpus": {"choices": [1, 2]},
                "flavor": {"choices": ["h200", "shared"]},
                "image": {
                    "choices": {"base": "quay.io/jupyter/base-notebook:latest"},
                    "unlisted_choice": {
                        "validation_regex": "^quay\\.io/jupyter/[a-z-]+:[a-z0-9.]+$"
                    },
                },
            },
        },
        "cpu": {"cpu": "100m", "memory": "128Mi"},
    },
    "everyone": {"profiles": ["cpu"]},
    "groups": {"research": {"quota": {"gpus": 2}, "profiles": ["research"]}},
}
SLUGS = ["research--research", "everyone--cpu"]


def _config() -> Config:
    config = Config()
    config.GPUPolicy.update(POLICY)
    return config


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=50)
    | st.sampled_from(["1", "2", "3", "h200", "shared", "base", "", "x" * 5000, "é\n\u2028²"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3)
    ),
    max_leaves=8,
)
option_keys = st.sampled_from(["profile", "gpus", "flavor", "image", "image--unlisted-choice"])
user_options = st.one_of(
    json_values,
    st.dictionaries(option_keys | st.text(max_size=20), json_values, max_size=5),
    st.fixed_dictionaries(
        {"profile": st.sampled_from(SLUGS) | json_values},
        optional={
            "gpus": st.sampled_from([1, 2, 1.0, 2.5, "1", "2", "4", True]) | json_values,
            "flavor": st.sampled_from(["h200", "shared", "nope"]) | json_values,
            "image": st.sampled_from(["base", "other"]) | json_values,
            "image--unlisted-choice": st.sampled_from(
                ["quay.io/jupyter/scipy-notebook:2024.1", "evil.example/x:1", "q" * 200_000]
            )
            | json_values,
        },
    ),
)


@pytest.fixture(scope="module")
def spawner_loop():
    """An offline spawner and the event loop it was made in (its client is the loop's)."""
    loop = asyncio.new_event_loop()

    async def make():
        return offline_spawner(_config(), "ann", ["research"])

    yield loop.run_until_complete(make()), loop
    # KubeSpawner's shared client closes when its task is cancelled
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.close()


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(options=user_options)
def test_any_json_options_are_a_short_refusal_or_a_spawn_kubespawner_accepts(spawner_loop, options):
    spawner, loop = spawner_loop
    policy = policy_from_config(_config())
    selection = refused = None
    try:
        selection = select(policy, ["research"], options)
    except Refused as e:
        refused = e
        message = str(e)
        assert "\n" not in message
        assert "\u2028" not in message
        # the fixed words plus at most ECHO_LIMIT characters of the input, once
        assert len(message) <= 2 * ECHO_LIMIT + 40, message

    # the spawner's whole option path: the same answer, as an HTTP refusal below 500
    spawner.user_options = options
    refusal = None
    try:
        loop.run_until_complete(spawner.load_user_options())
    except SpawnRefused as e:
        refusal = e
    if refusal is not None:
        assert selection is None, f"select accepted {options!r}; the spawner refused: {refusal}"
        # a value of the wrong JSON type is a bad request; the rest is forbidden
        assert refusal.status_code == (400 if isinstance(refused, Malformed) else 403)
        assert refusal.message == str(refused)
    else:
        assert selection is not None
        # what KubeSpawner was given is the canonical form of the choice
        assert spawner.user_options == selection.user_options
        assert all(isinstance(v, str) for v in spawner.user_options.values())


def test_a_json_number_equal_to_a_choice_is_that_choice():
    policy = policy_from_config(_config())
    for raw in (2, 2.0, "2"):
        selection = select(policy, ["research"], {"profile": "research--research", "gpus": raw})
        assert selection.count == 2
        assert selection.user_options == {"profile": "research--research", "gpus": "2"}
    for raw in (True, 2.5, [2], {"2": 2}):
        with pytest.raises(Malformed, match="gpus: expected one of the form's choices"):
            select(policy, ["research"], {"profile": "research--research", "gpus": raw})


def test_refusals_quote_at_most_a_hundred_characters_of_input():
    policy = policy_from_config(_config())
    with pytest.raises(Refused) as refused:
        select(policy, ["research"], {"profile": "z" * 100_000})
    # the input quoted, cut short; the rest is the refusal's own words and next step
    assert str(refused.value).count("z") < ECHO_LIMIT
    assert len(str(refused.value)) < ECHO_LIMIT + 80
    assert str(refused.value).startswith("profile 'zzz")
    assert shown("a\nb") == "'a\\nb'"


# ---- the same through a real hub ------------------------------------------------------

#: (the status each is refused with, the body): a value of the wrong JSON type is a bad
#: request (400); a profile, choice, image or option not offered is forbidden (403)
BAD_SPAWNS = [
    (403, {"profile": "z" * 100_000}),
    (400, {"profile": "research--research", "gpus": [1]}),
    (400, {"profile": "research--research", "gpus": {"n": 1}}),
    (400, {"profile": "research--research", "gpus": True}),
    (403, {"profile": "research--research", "flavor": None, "gpus": 7}),
    (400, {"profile": ["research--research"]}),
    (403, {"profile": "research--research", "cmd": ["sh", "-c", "id"]}),
    (403, {"profile": "research--research", "image--unlisted-choice": "evil.example/miner:1"}),
    (400, {"profile": "research--research", "image--unlisted-choice": 12}),
    (403, {"profile": "other--research"}),
    (403, {"profile": "line\nbreak\u2028" * 10}),
    # bodies that are not objects: JupyterHub 6 refuses them itself; JupyterHub 5 hands
    # them to the spawner as its user_options
    (400, [1]),
    (400, "research--research"),
    (400, 3),
]


@pytest.mark.k8s
@pytest.mark.hub
async def test_bad_spawns_are_refused_one_line_each_and_the_hub_keeps_serving(hub_factory, core):
    hub = await hub_factory(
        users={"ann": ["research"]},
        policy=POLICY,
        # fewer than the bad spawns: a counted failure would stop the hub
        extra_config="c.Spawner.consecutive_failure_limit = 3\n",
    )
    namespace = hub.namespace
    # a valid spawn whose option is a JSON number: admitted, then stopped
    status, body = await api(
        hub, "POST", "/users/ann/server", {"profile": "research--research", "gpus": 1}
    )
    assert status in (201, 202), body

    async def has_pod():
        return (await core.list_namespaced_pod(namespace)).items or None

    (pod,) = await eventually(has_pod, "the server's pod")
    assert pod.spec.containers[0].resources.requests["nvidia.com/gpu"] == "1"
    # the spawn may still be pending (a 202): Stop again while the hub answers 500
    assert await stop_server(hub, "ann") in (202, 204)
    await wait_no_pods(core, namespace)

    for refused_with, options in BAD_SPAWNS:
        status, body = await api(hub, "POST", "/users/ann/server", options)
        assert status == refused_with, (options, status, body)
        message = body["message"]
        assert "\n" not in message, message
        assert "\u2028" not in message, message
        assert len(message) < 300, message
        if not isinstance(options, dict):
            # JupyterHub 6 refuses such a body itself; JupyterHub 5 passes it on
            assert message == "Body must be a JSON object" or message.startswith(
                "server options must be a JSON object"
            ), message
        assert (await core.list_namespaced_pod(namespace)).items == []
    # still serving, and still spawning (JupyterHub exits 2 s after its limit)
    await asyncio.sleep(3)
    assert hub.process.poll() is None
    status, _ = await api(hub, "GET", "/")
    assert status == 200
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "everyone--cpu"})
    assert status in (201, 202), body
    await eventually(has_pod, "a server after the bad spawns")
    assert hub.process.poll() is None


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_start_without_options_does_not_reuse_saved_ones_the_policy_does_not_know(
    hub_factory, core
):
    hub = await hub_factory(users={"ann": ["research"]}, policy=POLICY)
    # a site's profile from before the policy; JupyterHub saves the options it was sent
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "gpu-old"})
    assert status == 403, body
    assert body["message"] == (
        "profile 'gpu-old' is not offered to you: choose one the spawn form shows"
    )
    # a REST start with no body reuses the saved options: they are treated as absent
    status, body = await api(hub, "POST", "/users/ann/server")
    assert status in (201, 202), body

    async def profile_label():
        pods = (await core.list_namespaced_pod(hub.namespace)).items
        return pods[0].metadata.labels.get("gpu.jupyterhub.org/profile") if pods else None

    # ann's default profile: the first her groups offer
    assert await eventually(profile_label, "ann's pod") == "research"
    log = hub.log_path.read_text(errors="replace")
    assert "the server's saved options are not valid under the GPU policy" in log
    assert "profile 'gpu-old' is not offered to you" in log
    # options a start does send are still checked, saved ones or not
    assert await stop_server(hub, "ann") in (202, 204)
    await wait_no_pods(core, hub.namespace)
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "gpu-old"})
    assert status == 403, body
