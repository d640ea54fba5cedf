"""Pipeline schedules: the analytic critical path, its inputs, and the discrete-event simulator."""
