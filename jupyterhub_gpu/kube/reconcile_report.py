"""What one reconciliation pass did (or, in a dry run, would do), object by object."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ObjectError:
    kind: str  # e.g. "scheduling.run.ai/v2 Queue"
    name: str  # namespace/name or name
    message: str  # what went wrong and the fix

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.message}"


@dataclass
class ReconcileReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    unchanged: int = 0
    errors: list[ObjectError] = field(default_factory=list)
    #: objects not desired that were left in place, each with why
    kept: list[str] = field(default_factory=list)
    #: API writes this pass made (applies and deletes, failed ones included)
    writes: int = 0
    #: nothing was written: created, updated and pruned say what would have been
    dry_run: bool = False
    #: existing namespaces without our labels taken over, as adopt_namespaces allows
    adopted: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def unchanged_only(self) -> bool:
        """Everything was already as desired: nothing to write, keep or report."""
        return not (self.created or self.updated or self.pruned or self.kept or self.errors)

    def summary(self) -> str:
        would = "would be " if self.dry_run else ""
        text = (
            f"{len(self.created)} {would}created, {len(self.updated)} {would}updated, "
            f"{len(self.pruned)} {would}pruned, {self.unchanged} unchanged, "
            f"{len(self.kept)} kept, {len(self.errors)} errors"
        )
        if self.dry_run:
            text = f"dry run, nothing written: {text}"
        lines = [f"  would create {n}" for n in self.created] if self.dry_run else []
        lines += [f"  would update {n}" for n in self.updated] if self.dry_run else []
        lines += [f"  would prune {n}" for n in self.pruned] if self.dry_run else []
        lines += [f"  kept {k}" for k in self.kept]
        lines += [f"  adopted {a}" for a in self.adopted]
        return "\n".join([text, *lines, *(f"  {e}" for e in self.errors)])
