"""The Zero to JupyterHub 4.x values keys, for checking our values files offline.

Written by hand for this project from the chart's JSON schema,
``jupyterhub/values.schema.yaml`` in jupyterhub/zero-to-jupyterhub-k8s, read at
the tags 4.0.0 and 4.4.0 (and compared with 4.1.0, 4.2.0, 4.3.0 and 4.3.5). No
schema text is copied: only key names and which parts are open. CI cannot
download the chart, and no package on PyPI ships its schema.

What is transcribed: every object the schema closes (``additionalProperties:
false``) on the way to the keys our files use, with its *complete* property
list as of chart 4.0.0. Keys only grow across 4.x, so 4.0.0's list is what every
supported chart accepts (4.3.0 added e.g. ``httpRoute`` and
``hub.service.ipFamilies``; they are deliberately absent here). Below each
property one of:

- ``FREE``: the schema accepts anything there (``additionalProperties: true``,
  arrays of Kubernetes objects, scalars). Nothing below it is checked.
- a nested ``dict``: another closed object, checked the same way.
- ``UNLISTED``: closed in the schema but not transcribed here. A values file
  that sets keys inside it fails the check with a request to transcribe it.
- ``CONFIG``: ``hub.config``: section names must start with a capital letter
  and hold mappings (the 4.3+ rule; 4.0-4.2 accepted anything). The traits in
  each section are checked separately against the real classes.

What is not checked: value types and enums, ``required`` keys (the chart's own
defaults fill them), and anything under ``FREE``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

CHART_VERSIONS = ("4.0.0", "4.4.0")
SCHEMA_PATH = "jupyterhub/values.schema.yaml"

FREE = "free"
UNLISTED = "unlisted"
CONFIG = "config"

_NETWORK_POLICY = {
    "enabled": FREE,
    "ingress": FREE,
    "egress": FREE,
    "egressAllowRules": UNLISTED,
    "interNamespaceAccessLabels": FREE,
    "allowedIngressPorts": FREE,
}

SCHEMA: dict[str, Any] = {
    "enabled": FREE,
    "fullnameOverride": FREE,
    "nameOverride": FREE,
    "imagePullSecret": FREE,
    "imagePullSecrets": FREE,
    "custom": FREE,
    "global": FREE,
    "ingress": {
        "enabled": FREE,
        # any key with a string value (patternProperties)
        "annotations": FREE,
        "ingressClassName": FREE,
        "hosts": FREE,
        "pathSuffix": FREE,
        "pathType": FREE,
        "tls": FREE,
        "extraPaths": FREE,
    },
    "prePuller": UNLISTED,
    "cull": UNLISTED,
    "debug": UNLISTED,
    "rbac": UNLISTED,
    "hub": {
        "revisionHistoryLimit": FREE,
        "config": CONFIG,
        "extraFiles": UNLISTED,
        "baseUrl": FREE,
        "command": FREE,
        "args": FREE,
        "cookieSecret": FREE,
        "image": {"name": FREE, "tag": FREE, "pullPolicy": FREE, "pullSecrets": FREE},
        "networkPolicy": _NETWORK_POLICY,
        "db": UNLISTED,
        "labels": UNLISTED,
        "initContainers": FREE,
        "extraEnv": FREE,
        "extraConfig": FREE,
        "fsGid": FREE,
        "service": {
            "type": FREE,
            "ports": {"appProtocol": FREE, "nodePort": FREE},
            "annotations": UNLISTED,
            "extraPorts": FREE,
            "loadBalancerIP": FREE,
        },
        "pdb": UNLISTED,
        "existingSecret": FREE,
        "nodeSelector": FREE,
        "tolerations": FREE,
        "activeServerLimit": FREE,
        "allowNamedServers": FREE,
        "annotations": UNLISTED,
        "authenticatePrometheus": FREE,
        "concurrentSpawnLimit": FREE,
        "consecutiveFailureLimit": FREE,
        "podSecurityContext": FREE,
        "containerSecurityContext": FREE,
        "deploymentStrategy": UNLISTED,
        "extraContainers": FREE,
        "extraVolumeMounts": FREE,
        "extraVolumes": FREE,
        "livenessProbe": FREE,
        "readinessProbe": FREE,
        "namedServerLimitPerUser": FREE,
        "redirectToServer": FREE,
        "resources": FREE,
        "lifecycle": UNLISTED,
        # free in the schema; checked against JupyterHub's own classes by the tests
        "services": FREE,
        "loadRoles": FREE,
        "shutdownOnLogout": FREE,
        "templatePaths": FREE,
        "templateVars": FREE,
        "serviceAccount": UNLISTED,
        "extraPodSpec": FREE,
    },
    "proxy": {
        "chp": {
            "revisionHistoryLimit": FREE,
            "networkPolicy": _NETWORK_POLICY,
            "extraCommandLineFlags": FREE,
            "extraEnv": FREE,
            "pdb": UNLISTED,
            "nodeSelector": FREE,
            "tolerations": FREE,
            "containerSecurityContext": FREE,
            "image": UNLISTED,
            "livenessProbe": FREE,
            "readinessProbe": FREE,
            "resources": FREE,
            "defaultTarget": FREE,
            "errorTarget": FREE,
            "extraPodSpec": FREE,
        },
        "secretToken": FREE,
        "service": {
            "type": FREE,
            "labels": FREE,  # any key with a string value (patternProperties)
            "annotations": FREE,
            "nodePorts": {"http": FREE, "https": FREE},
            "disableHttpPort": FREE,
            "extraPorts": FREE,
            "loadBalancerIP": FREE,
            "loadBalancerSourceRanges": FREE,
        },
        "https": {
            "enabled": FREE,
            "type": FREE,
            "letsencrypt": {"contactEmail": FREE, "acmeServer": FREE},
            "manual": {"key": FREE, "cert": FREE},
            "secret": {"name": FREE, "key": FREE, "crt": FREE},
            "hosts": FREE,
        },
        "traefik": UNLISTED,
        "labels": UNLISTED,
        "annotations": UNLISTED,
        "deploymentStrategy": UNLISTED,
        "secretSync": UNLISTED,
    },
    "singleuser": {
        "networkPolicy": _NETWORK_POLICY,
        "podNameTemplate": FREE,
        "cpu": {"guarantee": FREE, "limit": FREE},
        "memory": {"guarantee": FREE, "limit": FREE},
        "image": {"name": FREE, "tag": FREE, "pullPolicy": FREE, "pullSecrets": FREE},
        "initContainers": FREE,
        "profileList": FREE,
        "extraFiles": UNLISTED,
        "extraEnv": FREE,
        "nodeSelector": FREE,
        "extraTolerations": FREE,
        "extraNodeAffinity": UNLISTED,
        "extraPodAffinity": UNLISTED,
        "extraPodAntiAffinity": UNLISTED,
        "cloudMetadata": UNLISTED,
        "cmd": FREE,
        "defaultUrl": FREE,
        "events": FREE,
        "extraAnnotations": UNLISTED,
        "extraContainers": FREE,
        "extraLabels": UNLISTED,
        "extraPodConfig": FREE,
        "extraResource": UNLISTED,
        "fsGid": FREE,
        "lifecycleHooks": UNLISTED,
        "networkTools": UNLISTED,
        "serviceAccountName": FREE,
        "startTimeout": FREE,
        "storage": UNLISTED,
        "allowPrivilegeEscalation": FREE,
        "uid": FREE,
    },
    "scheduling": {
        "userScheduler": {
            "enabled": FREE,
            "revisionHistoryLimit": FREE,
            "replicas": FREE,
            "image": UNLISTED,
            "pdb": UNLISTED,
            "nodeSelector": FREE,
            "tolerations": FREE,
            "labels": UNLISTED,
            "annotations": UNLISTED,
            "containerSecurityContext": FREE,
            "logLevel": FREE,
            "plugins": FREE,
            "pluginConfig": FREE,
            "resources": FREE,
            "serviceAccount": UNLISTED,
            "extraPodSpec": FREE,
        },
        "podPriority": UNLISTED,
        "userPlaceholder": UNLISTED,
        "corePods": UNLISTED,
        "userPods": UNLISTED,
    },
}

_CONFIG_SECTION = re.compile(r"^[A-Z]")


def unknown_keys(
    values: Mapping[str, Any], node: Mapping[str, Any] = SCHEMA, path: str = ""
) -> list[str]:
    """Every key in ``values`` the z2jh 4.x schema would refuse, as ``path: why``."""
    problems = []
    for key, value in values.items():
        here = f"{path}.{key}" if path else str(key)
        if key not in node:
            problems.append(f"{here}: not a key of the z2jh 4.x chart here")
            continue
        child = node[key]
        if child == FREE or value is None:  # null deletes a chart default (helm)
            continue
        if child == UNLISTED:
            if value:
                problems.append(
                    f"{here}: closed in the chart's schema but not transcribed in "
                    "tests/z2jh_schema.py; add its keys from the schema"
                )
            continue
        if child == CONFIG:
            if not isinstance(value, Mapping):
                problems.append(f"{here}: expected a mapping of config sections")
                continue
            for section, settings in value.items():
                if not _CONFIG_SECTION.match(str(section)):
                    problems.append(f"{here}.{section}: a section must be a class name")
                elif not isinstance(settings, Mapping):
                    problems.append(f"{here}.{section}: expected a mapping of traits")
            continue
        if not isinstance(value, Mapping):
            problems.append(f"{here}: expected a mapping")
            continue
        problems += unknown_keys(value, child, here)
    return problems
