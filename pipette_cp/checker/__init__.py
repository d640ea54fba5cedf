"""Solver-agnostic plan checker: one ``check_<family>`` per constraint family.

It knows nothing about solvers; every plan from every method goes through it.
"""

from pipette_cp.checker.checks import (
    CHECKS,
    Violation,
    assert_valid,
    check_memory_limit,
    check_no_failed_link,
    check_placement_bijection,
    check_plan,
    check_split_contiguous,
    check_split_covers_layers,
    check_tp_within_node,
    communication_pairs,
)

__all__ = [
    "CHECKS",
    "Violation",
    "assert_valid",
    "check_memory_limit",
    "check_no_failed_link",
    "check_placement_bijection",
    "check_plan",
    "check_split_contiguous",
    "check_split_covers_layers",
    "check_tp_within_node",
    "communication_pairs",
]
