"""Each process of a job has its own seed, and its sub-envs' seeds (seed .. seed + N - 1) are no other's."""

from __future__ import annotations

from rlctl.role_names import ROLES, Role
from rlctl.roles.context import process_seed


def test_sub_env_seeds_of_different_processes_never_coincide_and_runs_repeat():
    for job_seed in range(5):
        starts = sorted(process_seed(job_seed, role, rank) for role in ROLES for rank in (0, 1, 99, 100, 2**24 - 1))
        assert all(b - a >= 2**32 for a, b in zip(starts, starts[1:])), job_seed  # seed+i of one is none of another's
        assert len({s % 2**63 for s in starts}) == len(starts)  # torch's seeds differ too
    assert process_seed(3, Role.COLLECTOR, 7) == process_seed(3, Role.COLLECTOR, 7) != process_seed(4, Role.COLLECTOR, 7)
