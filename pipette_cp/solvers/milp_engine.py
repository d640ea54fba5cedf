"""The MILP solver PuLP runs for the split master, and the shortest limit worth a start."""

from __future__ import annotations

import pulp

#: Shortest time limit worth starting the MILP solver with (process start, MPS file,
#: presolve: given 0.4 s on an 80-unit LNS neighbourhood it took 1.06 s;
#: ``python -m pipette_cp.experiments.time_limits``).
MIN_CBC_S = 1.0


def milp_solver(
    time_limit_s: float, workers: int = 1, *, warm_start: bool = False, gap: float = 0.0
) -> pulp.LpSolver:
    """HiGHS (in-process) if PuLP finds it, else CBC (the system's, or PuLP's bundled one).

    ``warm_start`` passes the variables' initial values to CBC as a MIP start.
    """
    available = pulp.listSolvers(onlyAvailable=True)
    limit = max(time_limit_s, 0.01)
    if "HiGHS" in available:
        return pulp.HiGHS(msg=False, timeLimit=limit, threads=workers, gapRel=gap)
    if "HiGHS_CMD" in available:
        return pulp.HiGHS_CMD(msg=False, timeLimit=limit, threads=workers, gapRel=gap)
    # COIN_CMD with PuLP's bundled binary: PULP_CBC_CMD itself is deprecated in PuLP 3.3
    path = None if pulp.COIN_CMD().available() else pulp.PULP_CBC_CMD.pulp_cbc_path
    return pulp.COIN_CMD(
        msg=False, timeLimit=limit, threads=workers, gapRel=gap, path=path, warmStart=warm_start
    )
