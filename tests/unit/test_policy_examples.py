"""Every example values file parses to the model it always has: the policy's keys are
read through one table, and a change to it (or to a section's parser) that changes what
an example means shows here as a diff of the model, key by key.

After a change that is meant to alter a model, write the files again and review their
diff: ``PYTHONPATH=$PWD python3 tests/unit/test_policy_examples.py``.
"""

from __future__ import annotations

import pprint
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
BASE = ROOT / "helm-values" / "base.yaml"
EXAMPLES = {
    "university": [BASE, ROOT / "helm-values" / "university.yaml"],
    "department": [BASE, ROOT / "helm-values" / "department.yaml"],
    "enterprise": [BASE, ROOT / "helm-values" / "enterprise.yaml"],
    "demo": [ROOT / "jupyterhub-gpu-dev" / "jupyterhub_gpu_dev" / "demo_values.yaml"],
}


def model_text(paths: list[Path]) -> str:
    from jupyterhub_gpu.config.values import policy_from_values

    return pprint.pformat(policy_from_values(paths), width=100, sort_dicts=False) + "\n"


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_example_parses_to_the_model_it_always_has(example):
    expected = (GOLDEN / f"policy-{example}.txt").read_text()
    assert model_text(EXAMPLES[example]) == expected


if __name__ == "__main__":
    for name, paths in EXAMPLES.items():
        (GOLDEN / f"policy-{name}.txt").write_text(model_text(paths))
        print(f"wrote tests/golden/policy-{name}.txt", file=sys.stderr)
