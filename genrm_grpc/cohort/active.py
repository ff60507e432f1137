"""The active cohorts a registry holds, indexed three ways: by key, by group, by principal.

By group scope (principal + ``group_id``), so that supersession and the prompt check of
a new attempt look at O(attempts) cohorts; by principal, so that the per-principal quota
is one lookup. Active cohorts held elsewhere (replicas: the rest of the deployment)
count against both limits through ``count_elsewhere``. Book-keeping only: the rules
that use it are in ``genrm_grpc.cohort.registry``.
"""

from __future__ import annotations

from collections.abc import Mapping

from genrm_grpc.cohort.model import Cohort, CohortKey


class ActiveCohorts:
    """Every active cohort of one registry, and the counts its capacity rules read."""

    __slots__ = (
        "_by_group",
        "_by_key",
        "_by_principal",
        "_elsewhere",
        "_elsewhere_by_principal",
    )

    def __init__(self) -> None:
        self._by_key: dict[CohortKey, Cohort] = {}
        self._by_group: dict[str, dict[int, Cohort]] = {}
        self._by_principal: dict[str, int] = {}
        self._elsewhere = 0
        self._elsewhere_by_principal: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: CohortKey) -> Cohort | None:
        return self._by_key.get(key)

    def cohorts(self) -> list[Cohort]:
        return list(self._by_key.values())

    def attempts(self, scope: str | None) -> dict[int, Cohort]:
        """The group's active cohorts by attempt (empty when none, or no group)."""
        return self._by_group.get(scope, {}) if scope is not None else {}

    def has_group(self, scope: str) -> bool:
        return scope in self._by_group

    def add(self, cohort: Cohort) -> None:
        key = cohort.key
        self._by_key[key] = cohort
        principal = key.principal
        self._by_principal[principal] = self._by_principal.get(principal, 0) + 1
        scope = key.group_scope
        if scope is not None:
            self._by_group.setdefault(scope, {})[key.attempt] = cohort

    def remove(self, cohort: Cohort) -> None:
        """Forget ``cohort`` in every index (nothing happens when it is not held)."""
        key = cohort.key
        held = self._by_key.pop(key, None)
        if held is not None:
            left = self._by_principal[key.principal] - 1
            if left:
                self._by_principal[key.principal] = left
            else:
                del self._by_principal[key.principal]
        scope = key.group_scope
        attempts = self._by_group.get(scope) if scope is not None else None
        if attempts is not None and scope is not None:
            attempts.pop(key.attempt, None)
            if not attempts:
                del self._by_group[scope]

    def count_elsewhere(self, total: int, by_principal: Mapping[str, int]) -> None:
        self._elsewhere = total
        self._elsewhere_by_principal = dict(by_principal)

    def total(self) -> int:
        """Active cohorts against ``max_active_cohorts``: these and those elsewhere."""
        return len(self._by_key) + self._elsewhere

    def held_by(self, principal: str) -> int:
        """Active cohorts of ``principal`` here and elsewhere."""
        here = self._by_principal.get(principal, 0)
        return here + self._elsewhere_by_principal.get(principal, 0)
