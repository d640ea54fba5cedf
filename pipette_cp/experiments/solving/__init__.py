"""Experiments on the solvers and the search: speed, scaling, parallel workers, engines, methods compared."""
